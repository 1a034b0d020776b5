"""Tools a model may call: Python functions described to it as JSON schemas.

``tool`` turns a function into a ``Tool``: its name, the first line of its docstring and a
schema of its parameters read from the signature (``str``, ``int``, ``float``, ``bool``,
``list``, ``dict``; a parameter without a default is required). Pass ``parameters=`` for a
schema of your own. ``Context.converse`` runs the tools the model asks for: sync ones in a
thread, async ones on the loop, each raced against the attempt's token.
"""

import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass

JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean",
              list: "array", tuple: "array", dict: "object"}


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable
    description: str
    parameters: dict
    requires_approval: bool = False  # ``converse`` asks ``ctx.approval`` before each call

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def spec(self) -> dict:
        """The tool as the chat completions API takes it."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": self.parameters}}


def tool(fn: Callable | None = None, *, name: str | None = None,
         description: str | None = None, parameters: dict | None = None,
         requires_approval: bool = False):
    """Describe ``fn`` as a tool; usable as ``@tool`` or ``@tool(name=...)``. With
    ``requires_approval``, each call the model asks for waits for a person's decision
    (``Context.approval``) before it runs."""

    def make(fn: Callable) -> Tool:
        doc = inspect.getdoc(fn) or ""
        return Tool(name=name or fn.__name__, fn=fn,
                    description=description or (doc.splitlines()[0] if doc else fn.__name__),
                    parameters=parameters or parameters_of(fn),
                    requires_approval=requires_approval)

    return make(fn) if fn is not None else make


def as_tool(item) -> Tool:
    """A ``Tool`` as is, or a plain function described by ``tool``."""
    if isinstance(item, Tool):
        return item
    if callable(item):
        return tool(item)
    raise TypeError(f"a tool is a function or a Tool, not {type(item).__name__}")


def parameters_of(fn: Callable) -> dict:
    """The JSON schema of ``fn``'s keyword-callable parameters."""
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError):
        hints = {}
    properties, required = {}, []
    for parameter in inspect.signature(fn).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD,
                              parameter.POSITIONAL_ONLY):
            continue
        properties[parameter.name] = _schema_of(hints.get(parameter.name))
        if parameter.default is parameter.empty:
            required.append(parameter.name)
    return {"type": "object", "properties": properties, "required": required}


def _schema_of(annotation) -> dict:
    origin = typing.get_origin(annotation) or annotation
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return _schema_of(options[0]) if len(options) == 1 else {}
    kind = JSON_TYPES.get(origin)
    return {"type": kind} if kind else {}


class Toolbox:
    """The tools of one conversation, by name."""

    def __init__(self, tools=()):
        self.tools = [as_tool(item) for item in tools]
        self.by_name = {item.name: item for item in self.tools}
        if len(self.by_name) != len(self.tools):
            raise ValueError("two tools have the same name")

    def get(self, name: str) -> Tool | None:
        return self.by_name.get(name)

    def specs(self) -> list[dict]:
        return [item.spec() for item in self.tools]
