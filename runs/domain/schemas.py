"""Typed resume input: a ticket may carry a JSON Schema that the resume input must satisfy.

The agent declares the schema when it waits for input (``ctx.wait_for_input(schema=...)``);
the schema is checked when the ticket is issued, and the input when the run is resumed.
A schema never fetches anything over the network: a remote ``$ref`` is not followed.
"""

from jsonschema import exceptions
from jsonschema.validators import validator_for

from runs.domain.errors import InvalidRequest


def check_schema(schema) -> None:
    """Refuse a schema that is not a valid JSON Schema (of the draft it names, or the
    newest one)."""
    if schema is None:
        return
    if not isinstance(schema, (dict, bool)):
        raise InvalidRequest("schema must be a JSON object.", field="schema")
    try:
        validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as error:
        raise InvalidRequest(f"schema is not a valid JSON Schema: {error.message}",
                             field="schema") from None


def check_input(schema, value) -> None:
    """Refuse ``value`` unless it satisfies ``schema`` (no schema: anything goes), naming
    where it fails."""
    if schema is None:
        return
    validator = validator_for(schema)(schema)
    error = exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return
    where = "input" + "".join(f"[{part!r}]" if isinstance(part, str) else f"[{part}]"
                              for part in error.absolute_path)
    raise InvalidRequest(f"{where}: {error.message}", field="input")
