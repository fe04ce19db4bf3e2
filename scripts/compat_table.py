"""The README's compatibility table: every method of the pinned letta-client SDK, the HTTP call it
makes, and whether this server answers it. Read from the SDK's own source and this server's URLconf,
so the table cannot drift (tests/api/test_compatibility_table.py compares it with the README).

    .venv/bin/python scripts/compat_table.py    # prints the table
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CALL = re.compile(
    r"self\._(get_api_list|get|post|patch|put|delete)\(\s*(?:path_template\(\s*)?f?\"(/v1/[^\"]*)\""
)
METHOD = re.compile(r"^    def (\w+)\(", re.MULTILINE)
SKIPPED = {"with_raw_response", "with_streaming_response", "__init__"}


@dataclass(frozen=True)
class SdkMethod:
    name: str  # client.agents.blocks.list
    verb: str
    path: str  # /v1/agents/{agent_id}/core-memory/blocks


def sdk_methods() -> list[SdkMethod]:
    import letta_client

    resources = Path(letta_client.__file__).parent / "resources"
    found: dict[str, SdkMethod] = {}
    for file in sorted(resources.rglob("*.py")):
        source = file.read_text()
        start = source.find("(SyncAPIResource):")
        if start < 0:
            continue
        sync = source[start : source.find("(AsyncAPIResource):", start)]
        parts = list(file.relative_to(resources).with_suffix("").parts)
        if len(parts) > 1 and parts[-1] == parts[-2]:  # agents/agents.py is client.agents
            parts.pop()
        starts = [(m.start(), m.group(1)) for m in METHOD.finditer(sync)]
        for index, (offset, name) in enumerate(starts):
            if name in SKIPPED or name.startswith("_"):
                continue
            end = starts[index + 1][0] if index + 1 < len(starts) else len(sync)
            call = CALL.search(sync, offset, end)
            if call is None:
                continue
            verb = {"get_api_list": "GET"}.get(call.group(1), call.group(1).upper())
            qualified = ".".join(["client", *parts, name])
            found.setdefault(qualified, SdkMethod(qualified, verb, call.group(2)))
    return sorted(found.values(), key=lambda m: m.name)


def served(method: SdkMethod) -> str:
    """'yes', 'Letta Cloud only' (a JSON 501 here) or 'no'."""
    from django.urls import Resolver404, resolve

    path = re.sub(r"\{(\w+)\}", lambda m: f"{m.group(1).removesuffix('_id')}-00000000", method.path)
    try:
        match = resolve(path)
    except Resolver404:
        return "no"
    view = getattr(match.func, "view_class", None) or getattr(match.func, "cls", None)
    if view is None:
        return "no"
    if getattr(view, "cloud_only", False):
        return "Letta Cloud only"
    return "yes" if hasattr(view, method.verb.lower()) else "no"


def table() -> str:
    methods = sdk_methods()
    statuses = [(method, served(method)) for method in methods]
    count = sum(status == "yes" for _, status in statuses)
    lines = [
        f"{count} of {len(methods)} methods of letta-client "
        f"{_sdk_version()} are served (read from the SDK's source by `scripts/compat_table.py`).",
        "",
        "| SDK method | HTTP | Served |",
        "| --- | --- | --- |",
    ]
    lines += [f"| `{m.name}` | `{m.verb} {m.path}` | {status} |" for m, status in statuses]
    return "\n".join(lines)


def _sdk_version() -> str:
    from letta_client import __version__

    return __version__


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    # Only the URLconf is read: settings that guard real secrets need a value, never a real one.
    os.environ.setdefault("DJANGO_SECRET_KEY", "compat-table-only")
    os.environ.setdefault("SECRETS_ENCRYPTION_KEY", "Y29tcGF0LXRhYmxlLW9ubHktbm90LWEtcmVhbC1rZXk=")
    os.environ.setdefault("DATABASE_URL", "postgresql://unused@127.0.0.1:1/unused")
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:1/0")
    import django

    django.setup()
    print(table())
