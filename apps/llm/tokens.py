"""Offline token counting for context-window budgeting.

litellm picks a tokenizer by model name (tiktoken for OpenAI-style names, bundled tokenizers for some
others; HuggingFace downloads are disabled in apps.llm._litellm). A count is an estimate either way:
providers add their own per-message overhead, so callers keep a safety margin.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from typing import Any

from apps.llm._litellm import litellm

logger = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
"""Fallback ratio when litellm cannot count: about 4 characters per token for English text."""

COUNT_CACHE_SIZE = 1024
_counted: dict[tuple[str, bytes], int] = {}  # (model, digest of messages and tools) -> tokens: count_tokens


def _count_key(
    name: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> tuple[str, bytes]:
    text = json.dumps([messages, tools], separators=(",", ":"), default=str)
    return name, hashlib.blake2b(text.encode(), digest_size=16).digest()


def count_tokens(
    model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> int:
    """Tokens that `messages` (and `tools`' schemas) take in `model`'s prompt; never raises.

    `model` may be a litellm model string (`openai/gpt-4o-mini`) or a bare name. Image parts are
    counted at a fixed size instead of being downloaded.
    """
    name = model.split("/", 1)[1] if model.startswith(("openai/", "anthropic/", "ollama/")) else model
    # A step counts its system message and its tool schemas, which seldom change from one step to the
    # next: those (at most one message) are remembered by their JSON text (~0.4 + 0.15 ms a step).
    key = _count_key(name, messages, tools) if len(messages) <= 1 else None
    if key is not None and (known := _counted.get(key)) is not None:
        return known
    try:
        count = int(
            litellm.token_counter(
                model=name, messages=messages, tools=tools or None, use_default_image_token_count=True
            )
        )
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        logger.warning("llm.token_count_fallback", extra={"model": model, "error": str(exc)})
        return estimate_tokens(json.dumps(messages, default=str) + json.dumps(tools or [], default=str))
    if key is not None:
        if len(_counted) >= COUNT_CACHE_SIZE:
            _counted.clear()  # a few hundred agents' system messages; a miss costs one count
        _counted[key] = count
    return count


def count_text_tokens(model: str, text: str) -> int:
    """Tokens in a plain string (a completion, a block value); never raises."""
    if not text:
        return 0
    name = model.split("/", 1)[1] if model.startswith(("openai/", "anthropic/", "ollama/")) else model
    try:
        return int(litellm.token_counter(model=name, text=text))
    except (ValueError, TypeError, KeyError, AttributeError):
        return estimate_tokens(text)


def estimate_tokens(text: str) -> int:
    """The character-ratio estimate used when no tokenizer applies."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)
