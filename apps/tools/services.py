from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from apps.core import permissions
from apps.core.actor import Actor
from apps.core.errors import Conflict, InvalidInput, NotFound
from apps.core.permissions import Action
from apps.sandbox.images import BadRequirement, normalize_requirements
from apps.sandbox.selection import run_in_sandbox
from apps.tools.builtin import (  # noqa: F401 - MULTI_AGENT_TOOLS, for the adapters
    BUILTIN_TOOLS,
    MULTI_AGENT_TOOLS,
    builtin_definition,
)
from apps.tools.execution import ToolStatus, cut_to_limit, output_lines, stringify
from apps.tools.mcp import (  # noqa: F401 - MCP servers' writes, for the adapters
    SyncSummary,
    mcp_server_create,
    mcp_server_delete,
    mcp_server_sync_tools,
    mcp_server_update,
    mcp_tool_register,
    mcp_tool_run,
)
from apps.tools.models import DEFAULT_RETURN_CHAR_LIMIT, Tool
from apps.tools.schema import ToolSchemaError, generate_schema, parse_google_docstring, validate_tool_name
from apps.tools.selectors import LETTA_TOOL_TYPE_PREFIX


def tool_upsert_builtins(
    *, actor: Actor, names: list[str] | tuple[str, ...] | None = None
) -> dict[str, Tool]:
    """Make sure the organisation has current rows for these built-in tools (all when None). Idempotent.

    A custom tool that took one of these names before the server reserved it is left as it is (and
    returned under that name): refreshing it would replace its owner's code."""
    wanted = list(names) if names is not None else list(BUILTIN_TOOLS)
    existing = {t.name: t for t in Tool.objects.for_actor(actor).filter(name__in=wanted)}
    for name in wanted:
        definition = builtin_definition(name)
        tool = existing.get(name)
        if tool is None:
            try:
                with transaction.atomic():
                    existing[name] = Tool.objects.for_actor(actor).create(name=name, **definition)
            except IntegrityError:  # created concurrently by another request
                existing[name] = Tool.objects.for_actor(actor).get(name=name)
        elif tool.tool_type.startswith(LETTA_TOOL_TYPE_PREFIX) and any(
            getattr(tool, key) != value for key, value in definition.items()
        ):
            for key, value in definition.items():
                setattr(tool, key, value)
            tool.save(update_fields=[*definition, "updated_at"])
    return existing


def tool_upsert_builtin(*, actor: Actor, name: str) -> Tool:
    """The organisation's row of one built-in tool, made current (see tool_upsert_builtins). Raises
    InvalidInput for a name that is no built-in."""
    if name not in BUILTIN_TOOLS:
        raise InvalidInput(f"Unknown built-in tool '{name}'")
    return tool_upsert_builtins(actor=actor, names=[name])[name]


# --- user tools through the /v1/tools API: create / upsert by name, update, delete, run, approval rules ---

MAX_RETURN_CHAR_LIMIT = 1_000_000
"""Letta's upper bound for `return_char_limit`."""
SOURCE_TYPES = ("python", "typescript")
_UNSET: Any = object()


class BuiltinToolReadOnly(InvalidInput):
    """Built-in (letta_*) tools are defined by the server: they cannot be created, changed or deleted."""

    code = "builtin_tool_read_only"


class ToolNameConflict(Conflict):
    code = "tool_name_conflict"


class ToolSourceTooLarge(ToolSchemaError):
    """Source past TOOL_SOURCE_MAX_BYTES: refused before it is parsed (a 400; the ADE shows the message)."""

    code = "tool_source_too_large"


def check_source_size(source_code: object) -> None:
    """Raise ToolSourceTooLarge for source longer than TOOL_SOURCE_MAX_BYTES (UTF-8). Every way source
    enters (API, agent files, the ADE's editor and preview) passes here before anything parses it."""
    if not isinstance(source_code, str):
        return
    limit = settings.TOOL_SOURCE_MAX_BYTES
    size = len(source_code.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise ToolSourceTooLarge(
            f"tool source is {size:,} bytes; the limit is {limit:,} bytes (TOOL_SOURCE_MAX_BYTES)"
        )


def is_builtin_tool(tool: Tool) -> bool:
    """A server-defined tool: a `letta_*` tool type, or a name the server reserves for one."""
    return tool.tool_type.startswith(LETTA_TOOL_TYPE_PREFIX) or tool.name in BUILTIN_TOOLS


def _refuse_builtin(name: str) -> None:
    if name in BUILTIN_TOOLS:
        raise BuiltinToolReadOnly(
            f"Tool '{name}' is a built-in Letta tool: built-in tools cannot be created, modified or deleted."
        )


def _top_level_functions(source_code: str) -> list[str]:
    try:
        module = ast.parse(source_code)
    except (SyntaxError, ValueError) as exc:
        raise ToolSchemaError(f"tool source does not parse: {exc}") from exc
    return [n.name for n in module.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def build_tool_schema(
    *,
    source_code: str,
    source_type: str = "python",
    json_schema: dict[str, Any] | None = None,
    args_json_schema: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The tool's JSON schema: `json_schema` as given (checked), else one built around `args_json_schema`,
    else generated from the Python source's signature and docstring.

    Raises ToolSchemaError with the generator's message (e.g. a parameter missing from the docstring).
    """
    check_source_size(source_code)
    if source_type not in SOURCE_TYPES:
        raise ToolSchemaError(f"source_type must be one of {', '.join(SOURCE_TYPES)}, got '{source_type}'")
    if json_schema is not None:
        return _checked_json_schema(json_schema, source_code=source_code, source_type=source_type)
    if source_type != "python":
        raise ToolSchemaError(
            f"a {source_type} tool needs a json_schema: schemas are generated from Python source only"
        )
    if args_json_schema is not None:
        functions = _top_level_functions(source_code)
        if not functions:
            raise ToolSchemaError("tool source defines no top-level function")
        if not isinstance(args_json_schema, dict):
            raise ToolSchemaError("args_json_schema must be a JSON object")
        module = ast.parse(source_code)
        function = [n for n in module.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)][-1]
        docstring = parse_google_docstring(ast.get_docstring(function) or "")
        return {
            "name": validate_tool_name(function.name),
            "description": docstring.description,
            "parameters": inline_json_schema(args_json_schema),
        }
    return generate_schema(source_code)


def inline_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """An args JSON schema as the model should see it, the way Letta turns a pydantic model's
    `model_json_schema()` into a tool's parameters: `$ref`s to `$defs` replaced by the nested objects
    they name, pydantic's `title`s dropped, `anyOf [X, null]` (an Optional field) as X. Pure.

    Raises ToolSchemaError for a reference that is not to `#/$defs/...`, names nothing, or is recursive.
    """
    definitions = schema.get("$defs", {}) if isinstance(schema, dict) else {}

    def walk(node: Any, expanding: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [walk(item, expanding) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            ref = node["$ref"]
            name = ref.removeprefix("#/$defs/") if isinstance(ref, str) else ""
            if not isinstance(ref, str) or not ref.startswith("#/$defs/") or name not in definitions:
                raise ToolSchemaError(f"args_json_schema refers to {ref!r}, which is not one of its $defs")
            if name in expanding:
                raise ToolSchemaError(
                    f"args_json_schema: '{name}' refers to itself; recursive models are not supported"
                )
            siblings = {key: value for key, value in node.items() if key != "$ref"}
            return {**walk(definitions[name], (*expanding, name)), **walk(siblings, expanding)}
        any_of = node.get("anyOf")
        if isinstance(any_of, list) and len(any_of) == 2 and {"type": "null"} in any_of:
            (concrete,) = [option for option in any_of if option != {"type": "null"}]
            rest = {key: value for key, value in node.items() if key != "anyOf"}
            return {**walk(concrete, expanding), **walk(rest, expanding)}
        inlined: dict[str, Any] = {}
        for key, value in node.items():
            if key == "$defs" or (key == "title" and isinstance(value, str)):
                continue
            if key in ("properties", "patternProperties") and isinstance(value, dict):
                inlined[key] = {name: walk(field, expanding) for name, field in value.items()}  # names kept
            else:
                inlined[key] = walk(value, expanding)
        return inlined

    result = walk(schema, ())
    return result if isinstance(result, dict) else schema


def tool_generate_schema(*, source_code: str, source_type: str = "python") -> dict[str, Any]:
    """The JSON schema a tool with this source gets (Letta's generate-schema), read with `ast`, never run.

    Raises ToolSchemaError (no function, a missing docstring entry, a TypeScript source: only Python
    schemas are generated; a TypeScript tool gives its json_schema), ToolSourceTooLarge.
    """
    check_source_size(source_code)
    if source_type != "python":
        raise ToolSchemaError(
            f"schemas are generated from Python source only; a {source_type} tool gives its json_schema"
        )
    return generate_schema(source_code)


def _checked_json_schema(schema: dict[str, Any], *, source_code: str, source_type: str) -> dict[str, Any]:
    if not isinstance(schema, dict):
        raise ToolSchemaError("json_schema must be a JSON object with a 'name'")
    name = validate_tool_name(schema.get("name"))
    parameters = schema.get("parameters", {"type": "object", "properties": {}, "required": []})
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise ToolSchemaError("json_schema.parameters must be a JSON schema object ({'type': 'object', ...})")
    description = schema.get("description", "")
    if not isinstance(description, str):
        raise ToolSchemaError("json_schema.description must be a string")
    if source_type == "python" and name not in _top_level_functions(source_code):
        raise ToolSchemaError(
            f"json_schema names the tool '{name}', but the source has no top-level function '{name}'"
        )
    return {**schema, "name": name, "description": description, "parameters": parameters}


MAX_TOOL_PIP_REQUIREMENTS = 100


def _check_pip_requirements(actor: Actor, requirements: list[Any] | None, current: list[Any] | None) -> None:
    """A tool's pip requirements are built into the organisation's sandbox images when it runs (Docker):
    valid PEP 508 requirements from the package index, at most MAX_TOOL_PIP_REQUIREMENTS, set by owners
    and admins (TOOL_PIP_REQUIREMENTS; keeping a tool's present ones is anyone's). Raises InvalidInput,
    PermissionDenied."""
    if not requirements:
        return
    if len(requirements) > MAX_TOOL_PIP_REQUIREMENTS:
        raise InvalidInput(f"pip_requirements: at most {MAX_TOOL_PIP_REQUIREMENTS} requirements")
    try:
        wanted = normalize_requirements(requirements)
    except BadRequirement as exc:
        raise InvalidInput(f"pip_requirements: {exc}") from exc
    try:
        unchanged = wanted == normalize_requirements(current or [])
    except BadRequirement:
        unchanged = False
    if not unchanged:
        permissions.require(actor, Action.TOOL_PIP_REQUIREMENTS)


def _check_return_limit(limit: int | None) -> None:
    if limit is not None and not 1 <= limit <= MAX_RETURN_CHAR_LIMIT:
        raise InvalidInput(f"return_char_limit must be between 1 and {MAX_RETURN_CHAR_LIMIT}, got {limit}")


@transaction.atomic
def tool_upsert(
    *,
    actor: Actor,
    source_code: str,
    source_type: str = "python",
    json_schema: dict[str, Any] | None = None,
    args_json_schema: dict[str, Any] | None = None,
    description: str | None = None,
    tags: list[str] | None = None,
    return_char_limit: int | None = None,
    pip_requirements: list[dict[str, Any]] | None = None,
    npm_requirements: list[dict[str, Any]] | None = None,
    default_requires_approval: bool | None = None,
    enable_parallel_execution: bool | None = None,
    metadata: dict[str, Any] | None = None,
    tool_type: str = Tool.Type.CUSTOM,
) -> Tool:
    """Create the tool named by its schema, or update the organisation's tool of that name (Letta's POST
    and PUT both upsert by name). None = keep (or default, for a new tool).

    Raises ToolSchemaError (bad source or schema), BuiltinToolReadOnly (a built-in's name), InvalidInput.
    """
    schema = build_tool_schema(
        source_code=source_code,
        source_type=source_type,
        json_schema=json_schema,
        args_json_schema=args_json_schema,
    )
    name = schema["name"]
    _refuse_builtin(name)
    _check_return_limit(return_char_limit)
    given = {
        "description": description,
        "tags": tags,
        "return_char_limit": return_char_limit,
        "pip_requirements": pip_requirements,
        "npm_requirements": npm_requirements,
        "default_requires_approval": default_requires_approval,
        "enable_parallel_execution": enable_parallel_execution,
        "metadata": metadata,
    }
    fields = {key: value for key, value in given.items() if value is not None}
    fields |= {
        "source_code": source_code,
        "source_type": source_type,
        "json_schema": schema,
        "args_json_schema": args_json_schema,
        "tool_type": tool_type,
        "last_updated_by_id": actor.user_id,
    }
    tools = Tool.objects.for_actor(actor)
    existing = tools.select_for_update().filter(name=name).first()
    _check_pip_requirements(actor, pip_requirements, existing.pip_requirements if existing else None)
    if existing is None:
        fields.setdefault("description", schema.get("description", ""))
        try:
            with transaction.atomic():
                return tools.create(name=name, created_by_id=actor.user_id, **fields)
        except IntegrityError:  # created concurrently under the same name: update that one instead
            existing = tools.select_for_update().get(name=name)
    if is_builtin_tool(existing):
        _refuse_builtin(existing.name)
    require_tool_writer(actor, existing)
    if description is None:
        fields["description"] = schema.get("description", "") or existing.description
    for key, value in fields.items():
        setattr(existing, key, value)
    existing.save()
    return existing


def require_tool_writer(actor: Actor, tool: Tool) -> None:
    """A tool runs in every agent that has it, with that agent's secrets: only owners, admins and the
    member who created it may change or delete it, and once an agent someone else created uses it,
    only owners and admins (its creator swapping the code would read that agent's secrets).
    Raises PermissionDenied."""
    if permissions.allows(actor, Action.TOOL_WRITE):
        return
    shared = tool.agent_attachments.exclude(agent__created_by_id=actor.user_id).exists()
    permissions.require(
        actor, Action.TOOL_WRITE, creator_id=tool.created_by_id, shared=shared, subject=f"tool '{tool.name}'"
    )


@transaction.atomic
def tool_update(
    *,
    actor: Actor,
    tool_id: str,
    source_code: str = _UNSET,
    source_type: str = _UNSET,
    json_schema: dict[str, Any] = _UNSET,
    args_json_schema: dict[str, Any] = _UNSET,
    description: str = _UNSET,
    tags: list[str] = _UNSET,
    return_char_limit: int = _UNSET,
    pip_requirements: list[dict[str, Any]] = _UNSET,
    npm_requirements: list[dict[str, Any]] = _UNSET,
    default_requires_approval: bool = _UNSET,
    enable_parallel_execution: bool = _UNSET,
    metadata: dict[str, Any] = _UNSET,
) -> Tool:
    """Change any subset of a user tool (UNSET = keep). New source (or schema) regenerates the schema, and
    the tool takes the function's name.

    Raises NotFound, BuiltinToolReadOnly, ToolSchemaError, ToolNameConflict (409) when the new name is taken.
    """
    tool = Tool.objects.for_actor(actor).select_for_update().filter(id=tool_id).first()
    if tool is None:
        raise NotFound(f"Tool with id '{tool_id}' not found")
    if is_builtin_tool(tool):
        raise BuiltinToolReadOnly(
            f"Tool '{tool.name}' is a built-in Letta tool: built-in tools cannot be created, modified or deleted."
        )
    require_tool_writer(actor, tool)
    if return_char_limit is not _UNSET:
        _check_return_limit(return_char_limit)
    if pip_requirements is not _UNSET:
        _check_pip_requirements(actor, pip_requirements, tool.pip_requirements)
    schema_inputs = (source_code, source_type, json_schema, args_json_schema)
    if any(value is not _UNSET for value in schema_inputs):
        new_source = tool.source_code if source_code is _UNSET else source_code
        new_args = tool.args_json_schema if args_json_schema is _UNSET else args_json_schema
        schema = build_tool_schema(
            source_code=new_source,
            source_type=tool.source_type if source_type is _UNSET else source_type,
            json_schema=None if json_schema is _UNSET else json_schema,
            args_json_schema=new_args,
        )
        if schema["name"] != tool.name:
            _refuse_builtin(schema["name"])
            if Tool.objects.for_actor(actor).filter(name=schema["name"]).exclude(id=tool.id).exists():
                raise ToolNameConflict(f"Tool with name '{schema['name']}' already exists")
        tool.name = schema["name"]
        tool.json_schema = schema
        tool.source_code = new_source
        tool.args_json_schema = new_args
        if source_type is not _UNSET:
            tool.source_type = source_type
        if description is _UNSET:
            tool.description = schema.get("description", "") or tool.description
    plain = {
        "description": description,
        "tags": tags,
        "return_char_limit": return_char_limit,
        "pip_requirements": pip_requirements,
        "npm_requirements": npm_requirements,
        "default_requires_approval": default_requires_approval,
        "enable_parallel_execution": enable_parallel_execution,
        "metadata": metadata,
    }
    for key, value in plain.items():
        if value is not _UNSET:
            setattr(tool, key, value)
    tool.last_updated_by_id = actor.user_id
    try:
        with transaction.atomic():
            tool.save()
    except IntegrityError as exc:  # renamed concurrently onto a taken name
        raise ToolNameConflict(f"Tool with name '{tool.name}' already exists") from exc
    return tool


@transaction.atomic
def tool_delete(*, actor: Actor, tool_id: str) -> None:
    """Delete a user tool (and detach it from every agent). Raises NotFound, BuiltinToolReadOnly."""
    tool = Tool.objects.for_actor(actor).filter(id=tool_id).first()
    if tool is None:
        raise NotFound(f"Tool with id '{tool_id}' not found")
    if is_builtin_tool(tool):
        raise BuiltinToolReadOnly(
            f"Tool '{tool.name}' is a built-in Letta tool: built-in tools cannot be created, modified or deleted."
        )
    require_tool_writer(actor, tool)
    tool.delete()


def tool_rules_with_approval(
    tool_rules: list[dict[str, Any]], *, tool_name: str, requires_approval: bool
) -> list[dict[str, Any]]:
    """`tool_rules` with exactly one `requires_approval` rule for `tool_name` (or none). Pure; the agent
    layer stores the result (Letta's modify_approvals: other rules keep their order)."""
    others = [
        rule
        for rule in tool_rules
        if not (rule.get("type") == "requires_approval" and rule.get("tool_name") == tool_name)
    ]
    if requires_approval:
        return [*others, {"type": "requires_approval", "tool_name": tool_name}]
    return others


@dataclass(frozen=True)
class ToolRunOutcome:
    name: str
    status: ToolStatus
    tool_return: str
    stdout: list[str]
    stderr: list[str]
    sandbox: str = "local"


def tool_run(
    *,
    actor: Actor,
    args: dict[str, Any],
    source_code: str | None = None,
    tool_id: str | None = None,
    name: str | None = None,
    env_vars: dict[str, str] | None = None,
    pip_requirements: list[dict[str, Any]] | None = None,
) -> ToolRunOutcome:
    """Run a tool's source (given, or a stored user tool's) on `args` in the sandbox an agent would use
    (Docker where an engine answers, else the local one): never this process. The organisation's
    sandbox variables are set, then `env_vars`; `pip_requirements` (else a stored tool's own) are
    installed with the sandbox config's.

    Only owners and admins may run code this way (the role matrix's TOOL_RUN_CODE).
    Raises NotFound, BuiltinToolReadOnly (built-ins run only inside an agent), ToolSchemaError,
    InvalidInput (no function to call; the organisation forbids the local sandbox).
    """
    permissions.require(actor, Action.TOOL_RUN_CODE)
    _check_pip_requirements(actor, pip_requirements, None)
    limit = DEFAULT_RETURN_CHAR_LIMIT
    if tool_id is not None:
        tool = Tool.objects.for_actor(actor).filter(id=tool_id).first()
        if tool is None:
            raise NotFound(f"Tool with id '{tool_id}' not found")
        if is_builtin_tool(tool):
            raise BuiltinToolReadOnly(
                f"Tool '{tool.name}' is a built-in Letta tool: it runs only inside an agent"
            )
        source, function, limit = tool.source_code, tool.name, tool.return_char_limit
        if pip_requirements is None:
            pip_requirements = tool.pip_requirements
    elif source_code is not None:
        check_source_size(source_code)
        functions = _top_level_functions(source_code)
        function = name or (functions[-1] if functions else "")
        if function not in functions:
            raise ToolSchemaError(
                f"tool source has no top-level function named '{function}'"
                if function
                else "tool source defines no top-level function"
            )
        source = source_code
    else:
        raise InvalidInput("Give the tool's source_code or a tool_id")
    # The same sandbox an agent's call would use (Docker first), never this process.
    ran = run_in_sandbox(
        actor=actor,
        source_code=source,
        name=function,
        arguments=args,
        extra_env=env_vars or {},
        requirements=pip_requirements or (),
    )
    if ran.backend is None:
        raise InvalidInput(f"Tools cannot be run here: {ran.outcome.error}")
    outcome = ran.outcome
    if outcome.ok:
        status: ToolStatus = "success"
        text = cut_to_limit(stringify(outcome.return_value), limit)
    else:
        status, text = "error", f"Error executing tool {function}: {outcome.error}"
    return ToolRunOutcome(
        name=function,
        status=status,
        tool_return=text,
        stdout=list(output_lines(outcome.stdout, limit)),
        stderr=list(output_lines(outcome.stderr, limit)),
        sandbox=ran.backend,
    )


@transaction.atomic
def tool_create(
    *,
    actor: Actor,
    source_code: str,
    tags: list[str] | None = None,
    return_char_limit: int | None = None,
) -> Tool:
    """Create a new custom Python tool named after its function. Unlike tool_upsert (Letta's POST/PUT,
    which update a same-named tool), an existing name is refused, so "new tool" never overwrites one.

    Raises ToolSchemaError, BuiltinToolReadOnly, ToolNameConflict, InvalidInput.
    """
    name = build_tool_schema(source_code=source_code)["name"]
    _refuse_builtin(name)
    if Tool.objects.for_actor(actor).filter(name=name).exists():
        raise ToolNameConflict(
            f"A tool named '{name}' already exists: open it to edit, or rename the function."
        )
    return tool_upsert(actor=actor, source_code=source_code, tags=tags, return_char_limit=return_char_limit)
