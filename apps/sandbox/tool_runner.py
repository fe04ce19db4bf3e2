"""Runs inside the sandbox (local jail or container): read {source, name, arguments, env, sys_path} as JSON on
stdin, set `env` (the local jail passes the tool's variables this way: never through the host processes that
build the jail, where LD_PRELOAD or LD_DEBUG_OUTPUT would act as root), put `sys_path` first on the module
path (the local jail's read-only pydantic), call the function, write {ok, value | error} as JSON to
$TOOL_RESULT_PATH. Standard library only: pydantic is used only when the tool's own source imported it.

Arguments whose annotation names a pydantic model (Plan, list[Step], Plan | None, dict[str, Step]...) are
built into instances of the tool's own classes first, as Letta's sandbox does; arguments that do not fit
are an error naming each wrong field, and the tool is not called. Other arguments are passed as given.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import types

TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

MODULE_NAME = "__tool__"
MAX_SHOWN_INPUT = 80  # characters of a wrong value quoted back in the error


class InvalidArguments(Exception):
    """The arguments do not fit the tool's pydantic models; the message lists each wrong field."""


def main() -> None:
    payload = json.loads(sys.stdin.read())
    result_path = os.environ.pop("TOOL_RESULT_PATH")
    sys.path[:0] = [str(path) for path in payload.get("sys_path") or []]
    os.environ.update(payload.get("env") or {})
    # A real module, so that what resolves names through sys.modules (pydantic's forward references,
    # typing.get_type_hints under `from __future__ import annotations`, dataclasses) finds the tool's.
    module = types.ModuleType(MODULE_NAME)
    sys.modules[MODULE_NAME] = module
    try:
        # dont_inherit: the tool's code must not get this file's `from __future__ import annotations`.
        exec(compile(payload["source"], "<tool>", "exec", dont_inherit=True), module.__dict__)
        function = module.__dict__[payload["name"]]
        value = function(**model_arguments(function, payload["arguments"]))
        result = {"ok": True, "value": jsonable(value)}
    except InvalidArguments as exc:
        result = {"ok": False, "error": str(exc)}
    except BaseException:
        result = {"ok": False, "error": traceback.format_exc(limit=8)}
    with open(result_path, "w") as handle:
        json.dump(result, handle)


def _pydantic_apis() -> list[types.ModuleType]:
    """The pydantic APIs the tool has loaded: pydantic itself (2.x, or 1.x) and its v1 compatibility module."""
    return [sys.modules[name] for name in ("pydantic", "pydantic.v1") if name in sys.modules]


def model_arguments(function: Any, arguments: dict) -> dict:
    """`arguments` with every value whose parameter is annotated with a pydantic model (anywhere in the
    annotation) validated into that annotation. Raises InvalidArguments listing every wrong field."""
    apis = _pydantic_apis()
    if not apis or not arguments:
        return arguments  # typing is not even imported: a plain tool's call costs nothing more
    hints = _hints(function)
    built = dict(arguments)
    problems: list[str] = []
    for name, value in arguments.items():
        api = next((api for api in apis if _names_model(hints.get(name), api.BaseModel)), None)
        if api is None:
            continue
        annotation = hints[name]
        if isinstance(value, str):  # an object the model sent JSON-encoded, as Letta's coercion accepts
            try:
                decoded = json.loads(value)
            except ValueError:
                decoded = None
            if isinstance(decoded, (dict, list)):
                value = decoded
        try:
            if hasattr(api, "TypeAdapter"):
                built[name] = api.TypeAdapter(annotation).validate_python(value)
            else:
                built[name] = api.parse_obj_as(annotation, value)
        except api.ValidationError as exc:
            problems.append(f"'{name}' is not a valid {_type_name(annotation)}:")
            problems.extend(f"- {line}" for line in _error_lines(name, exc))
    if problems:
        raise InvalidArguments("Invalid arguments: " + "\n".join(problems))
    return built


def _hints(function: Any) -> dict:
    """The parameters' annotations as objects (string annotations evaluated in the tool's module)."""
    import typing

    try:
        return typing.get_type_hints(function, include_extras=True)
    except Exception:
        annotations = getattr(function, "__annotations__", None) or {}
        return {name: hint for name, hint in annotations.items() if not isinstance(hint, str)}


def _is_class(annotation: Any) -> bool:
    return isinstance(annotation, type) and not isinstance(annotation, getattr(types, "GenericAlias", ()))


def _names_model(annotation: Any, base: type, depth: int = 0) -> bool:
    """Does the annotation name a subclass of `base` anywhere (list[Step], Plan | None, Annotated[...])?"""
    import typing

    if annotation is None or depth > 20:
        return False
    if _is_class(annotation):
        try:
            if issubclass(annotation, base):
                return True
        except TypeError:
            return False
    return any(_names_model(arg, base, depth + 1) for arg in typing.get_args(annotation))


def _type_name(annotation: Any) -> str:
    if _is_class(annotation):
        return annotation.__name__
    return repr(annotation).replace(MODULE_NAME + ".", "").replace("typing.", "")


def _error_lines(name: str, exc: Exception) -> list[str]:
    """One line per wrong field: where it is (from the parameter down), what is wrong, what was given."""
    lines = []
    for error in exc.errors():  # type: ignore[attr-defined]
        loc = [part for part in error.get("loc", ()) if part != "__root__"]  # pydantic 1's list wrapper
        where = ".".join(str(part) for part in (name, *loc))
        line = f"{where}: {error.get('msg', 'invalid value')}"
        if "input" in error and error.get("type") != "missing":
            shown = repr(error["input"])
            if len(shown) > MAX_SHOWN_INPUT:
                shown = shown[: MAX_SHOWN_INPUT - 3] + "..."
            line += f" (got {shown})"
        lines.append(line)
    return lines


def jsonable(value: Any) -> Any:
    """The return value as JSON can carry it: as is, a pydantic model (or what holds models) as its JSON
    form, anything else as its repr."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        pass
    for api in _pydantic_apis():
        try:
            if hasattr(api, "TypeAdapter"):
                dumped = api.TypeAdapter(object).dump_python(value, mode="json")
            elif isinstance(value, api.BaseModel):
                dumped = json.loads(value.json())
            else:
                continue
            json.dumps(dumped)
            return dumped
        except Exception:
            continue
    return repr(value)


if __name__ == "__main__":
    main()
