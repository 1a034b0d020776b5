"""What the OpenAPI document says beyond what drf-spectacular infers."""


def refuse_unknown_fields(result, generator, request, public):
    """Request bodies (the ``...Request`` components of COMPONENT_SPLIT_REQUEST) are
    ``StrictSerializer``s: a key they do not declare is refused, and the document says so."""
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request") and component.get("type") == "object":
            component["additionalProperties"] = False
    return result
