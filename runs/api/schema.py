"""What the OpenAPI document says beyond what drf-spectacular infers."""


def refuse_unknown_fields(result, generator, request, public):
    """Request bodies (the ``...Request`` components of COMPONENT_SPLIT_REQUEST) are
    ``StrictSerializer``s: a key they do not declare is refused, and the document says so."""
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request") and component.get("type") == "object":
            component["additionalProperties"] = False
    return result


REVIEW_PATH = "/review/{token}/"


def review_links_documented(endpoints):
    """A review link (``/review/<token>/``) answers a browser with its page and a script
    with JSON, so its URL names a plain view that hands scripts to ``ReviewView``, which the
    generator would not find: its GET and POST are documented as that view's."""
    from runs.api.review import ReviewView

    if any(path == REVIEW_PATH for path, *_ in endpoints):
        return endpoints
    view = ReviewView.as_view()
    return [*endpoints, *((REVIEW_PATH, r"^review/(?P<token>[^/]+)/$", method, view)
                          for method in ("GET", "POST"))]
