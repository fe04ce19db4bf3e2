"""OpenAI function JSON schemas from Python tool source, read with `ast` and never executed.

User tools arrive as source text and only ever run in the sandbox, so the schema must come from the
syntax tree: the signature's annotations give the JSON types and the Google-style docstring gives the
descriptions, as in Letta's generator. A parameter may also name a pydantic model (a class deriving from
BaseModel) defined in the same source: it becomes a nested JSON object built from the class's fields.
"""

from __future__ import annotations

import ast
import copy
import keyword
import re
from dataclasses import dataclass, field
from typing import Any

from apps.tools.errors import ToolSchemaError

__all__ = [
    "INJECTED_PARAMS",
    "MAX_TOOL_NAME_LENGTH",
    "Docstring",
    "ToolSchemaError",
    "generate_schema",
    "parse_google_docstring",
    "validate_tool_name",
]

INJECTED_PARAMS = frozenset({"self", "agent_state"})
"""Parameters the server passes itself; they never appear in the schema the model sees."""

MAX_TOOL_NAME_LENGTH = 64
"""OpenAI rejects longer function names."""

_SUPPORTED = "str, int, float, bool, list[...], dict, tuple[...], Optional[...] / X | None or Literal[...]"


def validate_tool_name(name: object) -> str:
    """Return `name` if it can be a tool (function) name: an ASCII identifier, not a keyword, <= 64 chars."""
    if not isinstance(name, str):
        raise ToolSchemaError("tool name must be a string")
    if not name:
        raise ToolSchemaError("tool name must not be empty")
    if not (name.isascii() and name.isidentifier()):
        raise ToolSchemaError(
            f"tool name '{name}' is not a valid identifier: use ASCII letters, digits and underscores, "
            "not starting with a digit"
        )
    if keyword.iskeyword(name):
        raise ToolSchemaError(f"tool name '{name}' is a Python keyword")
    if len(name) > MAX_TOOL_NAME_LENGTH:
        raise ToolSchemaError(f"tool name '{name}' is longer than {MAX_TOOL_NAME_LENGTH} characters")
    return name


def generate_schema(source_code: str, *, name: str | None = None) -> dict[str, Any]:
    """Build `{"name", "description", "parameters"}` for the function `name` (else the last top-level one).

    Raises ToolSchemaError when the source does not parse, has no such function, lacks a docstring,
    or a parameter lacks a type annotation or an Args entry.
    """
    module = _parse(source_code)
    function = _find_function(module, name)
    models = _pydantic_models(module)
    tool = validate_tool_name(function.name)
    docstring_text = ast.get_docstring(function)
    if not docstring_text:
        raise ToolSchemaError(
            f"tool '{tool}' has no docstring; describe the tool and each parameter "
            "in a Google-style docstring (with an Args: section)"
        )
    docstring = parse_google_docstring(docstring_text)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for arg, has_default in _parameters(function, tool):
        if arg.arg in INJECTED_PARAMS:
            continue
        if arg.annotation is None:
            raise ToolSchemaError(f"parameter '{arg.arg}' of tool '{tool}' has no type annotation")
        description = docstring.params.get(arg.arg)
        if not description:
            raise ToolSchemaError(
                f"parameter '{arg.arg}' of tool '{tool}' is not described in the docstring's Args section"
            )
        schema, nullable = _json_schema(arg.annotation, _Where(tool, arg.arg, models))
        properties[arg.arg] = {**schema, "description": description}
        if not has_default and not nullable:
            required.append(arg.arg)
    return {
        "name": tool,
        "description": docstring.description,
        "parameters": {"type": "object", "properties": properties, "required": required},
    }


def _parse(source_code: str) -> ast.Module:
    if not isinstance(source_code, str):
        raise ToolSchemaError("tool source code must be a string")
    try:
        return ast.parse(source_code)
    except SyntaxError as exc:
        where = f"line {exc.lineno}: " if exc.lineno is not None else ""
        raise ToolSchemaError(f"tool source does not parse: {where}{exc.msg}") from exc
    except ValueError as exc:
        raise ToolSchemaError(f"tool source does not parse: {exc}") from exc


def _find_function(module: ast.Module, name: str | None) -> ast.FunctionDef | ast.AsyncFunctionDef:
    functions = [node for node in module.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    if name is not None:
        named = [function for function in functions if function.name == name]
        if not named:
            raise ToolSchemaError(f"tool source has no top-level function named '{name}'")
        return named[-1]
    if not functions:
        raise ToolSchemaError("tool source defines no top-level function")
    return functions[-1]


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef, tool: str) -> list[tuple[ast.arg, bool]]:
    """Every named parameter in call order, with whether it has a default. Variadics are refused:
    the model can only fill named arguments."""
    args = function.args
    if args.vararg is not None:
        raise ToolSchemaError(f"tool '{tool}' cannot take *{args.vararg.arg}; list each parameter explicitly")
    if args.kwarg is not None:
        raise ToolSchemaError(f"tool '{tool}' cannot take **{args.kwarg.arg}; list each parameter explicitly")
    positional = [*args.posonlyargs, *args.args]
    first_default = len(positional) - len(args.defaults)
    result = [(arg, index >= first_default) for index, arg in enumerate(positional)]
    result += [
        (arg, default is not None) for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]
    return result


@dataclass(frozen=True)
class _Where:
    tool: str
    param: str
    models: dict[str, ast.ClassDef] = field(default_factory=dict)
    expanding: tuple[str, ...] = ()  # the models being described, outermost first (cycles are refused)

    def refuse(self, node: ast.expr, why: str) -> ToolSchemaError:
        return ToolSchemaError(
            f"parameter '{self.param}' of tool '{self.tool}' has an unsupported type annotation "
            f"'{ast.unparse(node)}': {why}"
        )


def _json_schema(node: ast.expr, where: _Where) -> tuple[dict[str, Any], bool]:
    """JSON schema for an annotation, and whether it admits None (which makes the parameter optional)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            inner = ast.parse(node.value, mode="eval").body
        except SyntaxError as exc:
            raise where.refuse(node, "the string annotation does not parse") from exc
        return _json_schema(inner, where)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union(_flatten_or(node), node, where)
    base = _base_name(node.value if isinstance(node, ast.Subscript) else node)
    if not isinstance(node, ast.Subscript):
        if isinstance(node, ast.Name) and node.id in where.models:
            return _model_schema(where.models[node.id], node, where), False
        simple = _SIMPLE_TYPES.get(base or "")
        if simple is None:
            raise where.refuse(node, f"supported types are {_SUPPORTED}")
        return copy.deepcopy(simple), False
    args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    if base in {"list", "List"}:
        if len(args) != 1:
            raise where.refuse(node, "a list takes one item type")
        return {"type": "array", "items": _json_schema(args[0], where)[0]}, False
    if base in {"dict", "Dict"}:
        return {"type": "object"}, False
    if base == "Optional":
        return _json_schema(args[0], where)[0], True
    if base == "Union":
        return _union(args, node, where)
    if base == "Literal":
        return _literal(args, node, where), False
    if base in {"tuple", "Tuple"}:
        if any(isinstance(arg, ast.Constant) and arg.value is Ellipsis for arg in args):
            raise where.refuse(node, "variable-length tuples are not supported")
        items = [_json_schema(arg, where)[0] for arg in args]
        return {"type": "array", "prefixItems": items, "minItems": len(items), "maxItems": len(items)}, False
    if base == "Annotated":
        return _json_schema(args[0], where)
    raise where.refuse(node, f"supported types are {_SUPPORTED}")


_SIMPLE_TYPES: dict[str, dict[str, Any]] = {
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "bool": {"type": "boolean"},
    "list": {"type": "array", "items": {"type": "string"}},
    "List": {"type": "array", "items": {"type": "string"}},
    "dict": {"type": "object"},
    "Dict": {"type": "object"},
}
"""Bare list means a list of strings, as in Letta."""


def _pydantic_models(module: ast.Module) -> dict[str, ast.ClassDef]:
    """The module's top-level classes deriving from pydantic's BaseModel (directly, or from one another),
    by name: the types a parameter may name for a nested JSON object, as in Letta's tools."""
    classes = [node for node in module.body if isinstance(node, ast.ClassDef)]
    models: dict[str, ast.ClassDef] = {}
    grew = True
    while grew:
        grew = False
        for cls in classes:
            if cls.name not in models and any(
                _base_name(base) == "BaseModel" or (isinstance(base, ast.Name) and base.id in models)
                for base in cls.bases
            ):
                models[cls.name] = cls
                grew = True
    return models


def _model_schema(cls: ast.ClassDef, node: ast.expr, where: _Where) -> dict[str, Any]:
    """A pydantic model as a JSON object: its annotated fields, each described by `Field(description=...)`
    and required unless it has a default (pydantic's rule, which Letta's schemas follow)."""
    if cls.name in where.expanding:
        raise where.refuse(node, f"model '{cls.name}' refers to itself; recursive models are not supported")
    inner = _Where(where.tool, where.param, where.models, (*where.expanding, cls.name))
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, annotation, value in _model_fields(cls, where):
        description, has_default = _field_info(value)
        if not description:
            raise ToolSchemaError(
                f"field '{name}' of model '{cls.name}' (parameter '{where.param}' of tool '{where.tool}') has "
                "no description; give it one with Field(description=...)"
            )
        schema, _nullable = _json_schema(annotation, inner)
        properties[name] = {**schema, "description": description}
        if not has_default:
            required.append(name)
    result: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    docstring = ast.get_docstring(cls)
    if docstring:
        result["description"] = parse_google_docstring(docstring).description
    return result


def _model_fields(cls: ast.ClassDef, where: _Where) -> list[tuple[str, ast.expr, ast.expr | None]]:
    """(name, annotation, default) of a model's fields, its bases' first (as pydantic orders them)."""
    fields: dict[str, tuple[str, ast.expr, ast.expr | None]] = {}
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in where.models and base.id != cls.name:
            for item in _model_fields(where.models[base.id], where):
                fields[item[0]] = item
    for statement in cls.body:
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        name = statement.target.id
        if (
            name.startswith("_")
            or name == "model_config"
            or _base_name(_unwrap(statement.annotation)) == "ClassVar"
        ):
            continue
        fields[name] = (name, statement.annotation, statement.value)
    return list(fields.values())


def _unwrap(node: ast.expr) -> ast.expr:
    return node.value if isinstance(node, ast.Subscript) else node


def _field_info(value: ast.expr | None) -> tuple[str, bool]:
    """(description, has a default) from a field's right-hand side: nothing, a plain default, or
    `Field(...)` (a first positional argument or `default=` other than `...`, or a `default_factory=`)."""
    if value is None:
        return "", False
    if not (isinstance(value, ast.Call) and _base_name(value.func) == "Field"):
        return "", True
    keywords = {keyword.arg: keyword.value for keyword in value.keywords if keyword.arg}
    description = keywords.get("description")
    text = (
        description.value
        if isinstance(description, ast.Constant) and isinstance(description.value, str)
        else ""
    )
    default = value.args[0] if value.args else keywords.get("default")
    is_ellipsis = isinstance(default, ast.Constant) and default.value is Ellipsis
    has_default = "default_factory" in keywords or (default is not None and not is_ellipsis)
    return text, has_default


def _base_name(node: ast.expr) -> str | None:
    """`List` for both `List` and `typing.List`."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _flatten_or(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return [*_flatten_or(node.left), *_flatten_or(node.right)]
    return [node]


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _union(members: list[ast.expr], node: ast.expr, where: _Where) -> tuple[dict[str, Any], bool]:
    """Only `X | None` style unions have a JSON type here, as in Letta; a None member makes it optional."""
    concrete = [member for member in members if not _is_none(member)]
    if len(concrete) != 1:
        raise where.refuse(node, "unions other than Optional[X] / X | None are not supported")
    return _json_schema(concrete[0], where)[0], len(concrete) < len(members)


def _literal(args: list[ast.expr], node: ast.expr, where: _Where) -> dict[str, Any]:
    """An enum typed by its values (Letta always says "string"; we say what the values are)."""
    values: list[Any] = []
    for arg in args:
        value = arg.value if isinstance(arg, ast.Constant) else None
        if (
            isinstance(arg, ast.UnaryOp)
            and isinstance(arg.op, ast.USub)
            and isinstance(arg.operand, ast.Constant)
        ):
            value = -arg.operand.value if isinstance(arg.operand.value, int | float) else None
        if not isinstance(value, str | int | float):
            raise where.refuse(node, "Literal values must be strings, numbers or booleans")
        values.append(value)
    kinds = {type(value) for value in values}
    if kinds == {str}:
        json_type = "string"
    elif kinds == {bool}:
        json_type = "boolean"
    elif kinds == {int}:
        json_type = "integer"
    elif kinds <= {int, float}:
        json_type = "number"
    else:
        raise where.refuse(node, "Literal values must all be strings, all numbers or all booleans")
    return {"type": json_type, "enum": values}


@dataclass(frozen=True)
class Docstring:
    """The parts of a Google-style docstring a tool schema uses."""

    description: str
    params: dict[str, str] = field(default_factory=dict)
    returns: str | None = None


_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Returns|Return|Yields|Yield|"
    r"Raises|Examples|Example|Notes|Note|Attributes|Warnings|Warning|See Also|Todo):\s*$"
)
_ARG_SECTIONS = frozenset({"Args", "Arguments", "Parameters", "Params", "Keyword Args", "Keyword Arguments"})
_RETURN_SECTIONS = frozenset({"Returns", "Return", "Yields", "Yield"})
_ENTRY = re.compile(r"\*{0,2}(?P<name>\w++)\s*+(?:\([^)]*+\)\s*+)?:(?P<text>.*)")
"""`name (type): text` or `name: text`. Linear in the line: no two quantifiers can share characters, and
none gives any back (possessive). The pattern it replaces, `\\w+\\s*(?:\\([^)]*\\))?\\s*:`, tried every split
of a run of blanks between two `\\s*` when no colon followed, so one such line of source cost the square of
its length while holding the GIL: 80 KB froze the web process for 11 s (issue 16)."""


def parse_google_docstring(text: str) -> Docstring:
    """Split a cleaned docstring into its summary text, Args entries and Returns text.

    Sections start at unindented `Header:` lines; an Args entry is `name (type): text` or `name: text`,
    and more-indented lines continue it (joined with newlines, as Letta keeps them).
    """
    sections: dict[str, list[str]] = {}
    current = ""
    description: list[str] = []
    for line in text.expandtabs().splitlines():
        header = _SECTION.match(line)
        if header:
            current = header.group(1)
            sections.setdefault(current, [])
        elif current:
            sections[current].append(line)
        else:
            description.append(line)
    params: dict[str, str] = {}
    for section in _ARG_SECTIONS & sections.keys():
        params.update(_arg_entries(sections[section]))
    returns = next((_block(sections[name]) for name in _RETURN_SECTIONS & sections.keys()), None)
    return Docstring(description="\n".join(description).strip(), params=params, returns=returns or None)


def _arg_entries(lines: list[str]) -> dict[str, str]:
    entries: dict[str, list[str]] = {}
    indent: int | None = None
    name: str | None = None
    for line in lines:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        indent = depth if indent is None else indent
        entry = _ENTRY.match(line.strip()) if depth <= indent else None
        if entry:
            name = entry.group("name")
            entries[name] = [entry.group("text").strip()]
        elif name is not None:
            entries[name].append(line.strip())
    return {key: "\n".join(part for part in parts if part) for key, parts in entries.items()}


def _block(lines: list[str]) -> str:
    return "\n".join(line.strip() for line in lines if line.strip())
