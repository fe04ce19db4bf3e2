"""Text into chunks of at most N tokens with an overlap, for embedding (files of folders).

Tokens are counted with cl100k_base (Letta's tokenizer for embeddings, EMBEDDING_TO_TOKENIZER_DEFAULT), the
tiktoken encoding litellm ships, so nothing is downloaded. Chunks end at line or sentence boundaries where
they can: a text is cut into lines, long lines into sentences and, past the chunk size, into token windows;
these pieces are packed greedily, and each chunk starts with the last pieces of the one before it, up to
`overlap` tokens. Each chunk is an exact piece of the text (nothing re-encoded), stripped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from apps.llm._litellm import litellm

DEFAULT_OVERLAP = 50  # tokens, as Letta's LlamaIndexChunker
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_by_tokens(text: str, *, chunk_tokens: int, overlap_tokens: int = DEFAULT_OVERLAP) -> list[str]:
    """Chunks of `text`, each at most `chunk_tokens` tokens (a line or sentence longer than that is cut by
    tokens), consecutive chunks sharing up to `overlap_tokens` (kept under half a chunk). Blank chunks are
    left out; an empty text has none."""
    if chunk_tokens < 1:
        raise ValueError("chunk_tokens must be at least 1")
    overlap = max(0, min(overlap_tokens, chunk_tokens // 2))
    encoding = litellm.encoding
    chunks: list[str] = []
    window: list[tuple[str, int]] = []
    size = 0
    for piece, tokens in _pieces(text, chunk_tokens, encoding):
        if window and size + tokens > chunk_tokens:
            chunks.append("".join(p for p, _ in window))
            kept: list[tuple[str, int]] = []
            kept_size = 0
            for earlier in reversed(window):
                if kept_size + earlier[1] > overlap or kept_size + earlier[1] + tokens > chunk_tokens:
                    break
                kept.insert(0, earlier)
                kept_size += earlier[1]
            window, size = kept, kept_size
        window.append((piece, tokens))
        size += tokens
    if window:
        chunks.append("".join(p for p, _ in window))
    return [chunk.strip() for chunk in chunks if chunk.strip()]


def _pieces(text: str, limit: int, encoding: object) -> Iterator[tuple[str, int]]:
    """(piece, its token count): lines with their line break, long lines as sentences, longer ones cut."""
    for line in text.splitlines(keepends=True):
        count = len(encoding.encode_ordinary(line))  # type: ignore[attr-defined]
        if count <= limit:
            yield line, count
            continue
        for sentence in _SENTENCE_END.split(line):
            tokens = encoding.encode_ordinary(sentence + " ")  # type: ignore[attr-defined]
            if len(tokens) <= limit:
                yield sentence + " ", len(tokens)
                continue
            decoded, offsets = encoding.decode_with_offsets(tokens)  # type: ignore[attr-defined]
            for start in range(0, len(tokens), limit):
                end = start + limit
                piece = decoded[offsets[start] : offsets[end] if end < len(offsets) else len(decoded)]
                yield piece, min(limit, len(tokens) - start)
