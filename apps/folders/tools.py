"""The file tools, Letta's open_files, grep_files and semantic_search_files (signatures in apps.tools.builtin),
run in-process by the agent loop for an agent with attached folders; and their registration with the loop.

Every failure the model can act on (an unknown file name, a bad range or pattern, a pattern that runs too
long, no embedding model) is an error result telling it what to do. grep_files uses the `regex` module for
its per-search timeout: a pathological pattern ((a+)+$ against a long line) is stopped after its share of
GREP_DEADLINE_SECONDS instead of holding the worker, while keeping Python's syntax (lookarounds,
backreferences) that Letta's models write, which RE2 would refuse.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import regex
from django.db import transaction
from django.utils import timezone
from pgvector.django import CosineDistance

from apps.agents import builtin_tools, context_sections
from apps.agents.models import Agent
from apps.core.actor import Actor
from apps.core.errors import InvalidInput
from apps.folders import rendering, selectors, services
from apps.folders.models import AgentFile, FileChunk, FileStatus, Folder
from apps.llm.embeddings import embed
from apps.memory.archival import embedding_target, filtered_vector_scan
from apps.memory.models import vector_index_expression
from apps.tools.execution import ToolContext, ToolResult

GREP_PAGE_SIZE = 20
GREP_MAX_COLLECTED = 1000
GREP_MAX_PATTERN = 1000
GREP_MAX_CONTEXT_LINES = 20
GREP_DEADLINE_SECONDS = 10.0
SEARCH_MAX_RESULTS = 50
PASSAGE_MAX_LINES = 20


class FileToolError(InvalidInput):
    code = "file_tool_error"


def register() -> None:
    """Called once from FoldersConfig.ready()."""
    builtin_tools.register_builtin("open_files", open_files)
    builtin_tools.register_builtin("grep_files", grep_files)
    builtin_tools.register_builtin("semantic_search_files", semantic_search_files)
    context_sections.register_directories(services.FILES_TOOL_TYPE, _directories)


def _directories(actor: Actor, agent: Any) -> str:
    return selectors.agent_directories(actor=actor, agent=agent)


def _attached_names(actor: Actor, agent: Agent) -> list[str]:
    return sorted(
        AgentFile.objects.for_actor(actor).filter(agent_id=agent.id).values_list("file_name", flat=True)
    )


def _touch(actor: Actor, agent: Agent, names: Sequence[str]) -> None:
    """Files the agent just used count as recently used (the least recently used close first)."""
    if names:
        AgentFile.objects.for_actor(actor).filter(agent_id=agent.id, file_name__in=list(names)).update(
            last_accessed_at=timezone.now()
        )


# --- open_files -----------------------------------------------------------------------------------------


def _requests(raw: Any) -> list[tuple[str, int | None, int | None]]:
    if not isinstance(raw, list) or not raw:
        raise FileToolError(
            "No file requests provided: give file_requests as a list of {file_name, offset, length}."
        )
    parsed = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("file_name"), str):
            raise FileToolError('Each file request is an object with a "file_name" ("<folder>/<file>").')
        offset, length = item.get("offset"), item.get("length")
        for key, value in (("offset", offset), ("length", length)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise FileToolError(f"{key} of {item['file_name']} must be an integer.")
        if offset is not None and offset < 0:
            raise FileToolError(f"Offset for file {item['file_name']} must be >= 0 (0-indexed), got {offset}")
        if length is not None and length < 1:
            raise FileToolError(f"Length for file {item['file_name']} must be >= 1, got {length}")
        parsed.append((item["file_name"], offset, length))
    return parsed


def _range_text(offset: int | None, length: int | None) -> str:
    if offset is not None and length is not None:
        return f" (lines {offset + 1}-{offset + length})"
    if offset is not None:
        return f" (lines {offset + 1}-end)"
    if length is not None:
        return f" (lines 1-{length})"
    return ""


def open_files(args: dict[str, Any], ctx: ToolContext, agent: Agent) -> ToolResult:
    requests = _requests(args.get("file_requests"))
    limits = selectors.agent_file_limits(agent)
    if len(requests) > limits.max_files_open:
        return ToolResult.error(
            f"Cannot open {len(requests)} files: at most {limits.max_files_open} files may be open at once."
        )
    names = [name for name, _, _ in requests]
    opened: list[str] = []
    evicted: list[str] = []
    with transaction.atomic():
        closed_first = (
            services.close_files(actor=ctx.actor, agent_id=agent.id, keep=names)
            if args.get("close_all_others")
            else []
        )
        for name, offset, length in requests:
            state = (
                AgentFile.objects.for_actor(ctx.actor)
                .select_related("file")
                .filter(agent_id=agent.id, file_name=name)
                .first()
            )
            if state is None:
                attached = _attached_names(ctx.actor, agent)
                return ToolResult.error(
                    f"{name} is not attached: check the name (<folder>/<file>). Attached files: "
                    f"{', '.join(attached) or 'none'}."
                )
            end = offset + length if offset is not None and length is not None else None
            if offset is None and length is not None:
                end = length
            try:
                result = services.open_file(actor=ctx.actor, agent=agent, state=state, start=offset, end=end)
            except rendering.RangeError as exc:
                return ToolResult.error(str(exc))
            evicted += [n for n in result.closed if n not in names]
            previous = ""
            if result.previous is not None:
                was_start, was_end = result.previous
                previous = (
                    f" (previously lines {was_start}-{was_end})"
                    if was_start and was_end
                    else f" (previously lines {was_start}-end)"
                    if was_start
                    else " (previously the whole file)"
                )
            opened.append(f"{name}{_range_text(offset, length)}{previous}")
    message = (
        f"Opened {opened[0]}" if len(opened) == 1 else f"Opened {len(opened)} files: {', '.join(opened)}"
    )
    if closed_first:
        message += f"\nClosed {len(closed_first)} other file(s) (close_all_others): {', '.join(closed_first)}"
    if evicted:
        message += f"\nClosed {len(evicted)} least recently used file(s) to stay within the open-file limit: {', '.join(evicted)}"
    return ToolResult.ok(message)


# --- grep_files -----------------------------------------------------------------------------------------


def _compile(pattern: str, what: str) -> Any:
    if len(pattern) > GREP_MAX_PATTERN:
        raise FileToolError(f"The {what} is too long: {len(pattern)} characters, at most {GREP_MAX_PATTERN}.")
    try:
        return regex.compile(pattern, regex.IGNORECASE | regex.MULTILINE | regex.VERSION0)
    except regex.error as exc:
        raise FileToolError(f"Invalid regular expression for the {what}: {exc}") from exc


def _include_pattern(include: str) -> str:
    """A glob such as *.md becomes a regex; anything else is taken as a regex (Letta's rule)."""
    if "*" in include and not any(c in include for c in "^$()[]{}\\+"):
        converted = include.replace(".", r"\.").replace("*", ".*").replace("?", ".")
        return converted if converted.endswith("$") else converted + "$"
    return include


def grep_files(args: dict[str, Any], ctx: ToolContext, agent: Agent) -> ToolResult:
    pattern = (args.get("pattern") or "").strip()
    if not pattern:
        return ToolResult.error("Empty search pattern: give a keyword or a regular expression.")
    compiled = _compile(pattern, "pattern")
    include = (args.get("include") or "").strip()
    include_re = _compile(_include_pattern(include), "include pattern") if include else None
    context = args.get("context_lines")
    context = 1 if context is None else max(0, min(int(context), GREP_MAX_CONTEXT_LINES))
    offset = max(0, int(args.get("offset") or 0))
    states = list(
        AgentFile.objects.for_actor(ctx.actor)
        .filter(agent_id=agent.id)
        .select_related("file")
        .order_by("file_name")
    )
    if not states:
        return ToolResult.ok("No files are attached to search.")
    deadline = time.monotonic() + GREP_DEADLINE_SECONDS
    if include_re is not None:
        try:
            states = [s for s in states if include_re.search(s.file_name, timeout=GREP_DEADLINE_SECONDS)]
        except TimeoutError:
            return ToolResult.error("The include pattern took too long to match: simplify it.")
        if not states:
            return ToolResult.ok(f"No files match the file name pattern '{include}'.")
    texts = selectors.file_texts(actor=ctx.actor, file_ids=[s.file_id for s in states])
    matches: list[tuple[str, int, list[str]]] = []
    for state in states:
        lines = rendering.content_lines(texts.get(state.file_id, ""), selectors.line_strategy(state.file))
        for index, line in enumerate(lines):
            remaining = deadline - time.monotonic()
            try:
                found = remaining > 0 and compiled.search(line, timeout=remaining)
            except TimeoutError:
                found, remaining = False, 0
            if remaining <= 0:
                return ToolResult.error(
                    f"The pattern took longer than {GREP_DEADLINE_SECONDS:g} seconds to search the files "
                    "(it may backtrack catastrophically): simplify it, or narrow the files with `include`."
                )
            if found:
                first, last = max(0, index - context), min(len(lines), index + context + 1)
                shown = [f"{'>' if i == index else ' '} {i + 1}: {lines[i]}" for i in range(first, last)]
                matches.append((state.file_name, index + 1, shown))
                if len(matches) >= GREP_MAX_COLLECTED:
                    break
        if len(matches) >= GREP_MAX_COLLECTED:
            break
    return ToolResult.ok(_grep_answer(ctx, agent, pattern, include, matches, offset))


def _grep_answer(
    ctx: ToolContext,
    agent: Agent,
    pattern: str,
    include: str,
    matches: list[tuple[str, int, list[str]]],
    offset: int,
) -> str:
    if not matches:
        where = f" in files matching '{include}'" if include else ""
        return f"No matches for '{pattern}'{where}."
    per_file: dict[str, int] = {}
    for name, _, _ in matches:
        per_file[name] = per_file.get(name, 0) + 1
    _touch(ctx.actor, agent, list(per_file))
    capped = len(matches) >= GREP_MAX_COLLECTED
    total = f"{GREP_MAX_COLLECTED}+" if capped else str(len(matches))
    page = matches[offset : offset + GREP_PAGE_SIZE]
    if not page:
        return f"{total} matches for '{pattern}'; offset {offset} is past the last one."
    out = [
        f"{total} matches for '{pattern}' in {len(per_file)} file(s); showing {offset + 1}-{offset + len(page)}.",
        "Matches per file:",
        *(f"  - {name}: {count}" for name, count in sorted(per_file.items(), key=lambda item: -item[1])),
        "",
    ]
    for name, number, shown in page:
        out += [f"=== {name}:{number} ===", *shown, ""]
    following = offset + len(page)
    if following < len(matches):
        out.append(f'More matches: call grep_files(pattern="{pattern}", offset={following}).')
    elif capped:
        out.append(
            f"Only the first {GREP_MAX_COLLECTED} matches were collected; narrow the pattern to see others."
        )
    else:
        out.append("No more matches.")
    return "\n".join(out)


# --- semantic_search_files ------------------------------------------------------------------------------


def semantic_search_files(args: dict[str, Any], ctx: ToolContext, agent: Agent) -> ToolResult:
    query = (args.get("query") or "").strip()
    if not query:
        return ToolResult.error("Empty search query: describe what to look for.")
    limit = args.get("limit")
    limit = 5 if limit is None else max(1, min(int(limit), SEARCH_MAX_RESULTS))
    folders = list(Folder.objects.for_actor(ctx.actor).filter(agents__id=agent.id))
    if not folders:
        return ToolResult.ok("No folders are attached to search.")
    hits: list[tuple[FileChunk, float]] = []
    by_model: dict[str, list[str]] = {}
    for folder in folders:
        by_model.setdefault(folder.embedding, []).append(folder.id)
    for handle, folder_ids in by_model.items():
        [vector] = embed(embedding_target(actor=ctx.actor, embedding_handle=handle), [query])
        dimension = len(vector)
        queryset = (
            FileChunk.objects.for_actor(ctx.actor)
            .filter(
                folder_id__in=folder_ids,
                embedding_dim=dimension,
                file__processing_status=FileStatus.COMPLETED,
                file__agent_states__agent_id=agent.id,
            )
            .annotate(distance=CosineDistance(vector_index_expression(dimension), vector))
            .order_by("distance")[:limit]
        )
        with filtered_vector_scan():
            hits += [(chunk, 1.0 - float(chunk.distance)) for chunk in queryset]
    hits.sort(key=lambda hit: -hit[1])
    hits = hits[:limit]
    if not hits:
        return ToolResult.ok(f"No passages found for '{query}'.")
    names = dict(
        AgentFile.objects.for_actor(ctx.actor)
        .filter(agent_id=agent.id, file_id__in={chunk.file_id for chunk, _ in hits})
        .values_list("file_id", "file_name")
    )
    _touch(ctx.actor, agent, list(set(names.values())))
    out = [f"{len(hits)} passage(s) for '{query}' in {len({c.file_id for c, _ in hits})} file(s):"]
    for number, (chunk, score) in enumerate(hits, start=1):
        lines = chunk.text.strip().splitlines()
        out.append(
            f"\n=== {names.get(chunk.file_id, chunk.file_id)} (passage #{number}, score {score:.3f}) ==="
        )
        out += [f"  {line}" for line in lines[:PASSAGE_MAX_LINES]]
        if len(lines) > PASSAGE_MAX_LINES:
            out.append(f"  ... [{len(lines) - PASSAGE_MAX_LINES} more lines: open the file to read them]")
    return ToolResult.ok("\n".join(out))
