"""Folder ingestion figures, embedding excluded: how fast an upload becomes chunks.

For each format, one generated document is parsed where ingestion parses it (`parse_bounded`: PDF, DOCX
and HTML in the parser jail, plain text in process) and split into token chunks (`split_by_tokens`, the
folder default of 512 tokens), `repeat` times; the figure is the throughput of the median run, with the
spread of the runs' times. The jail's start-up (~0.1 s) is part of every parse, as it is of every upload.
Needs no database; bench/run.py adds it to its table (`--only folders`).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from apps.folders.isolation import parse_bounded
from apps.llm.chunking import split_by_tokens
from tests.folders import documents

PDF_PAGES = 200
LINES_PER_PAGE = 40
TEXT_BYTES = 4 * 1024 * 1024
CHUNK_TOKENS = 512
DOCX_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


def _line(page: int, line: int) -> str:
    return (
        f"Page {page}, line {line}: the quarterly figures for region {line % 7} grew by {page % 13} percent."
    )


def corpus() -> dict[str, tuple[bytes, str, dict[str, int]]]:
    """name -> (document, media type, its size in pages and bytes)."""
    pages = [[_line(p, i) for i in range(LINES_PER_PAGE)] for p in range(PDF_PAGES)]
    pdf = documents.pdf(pages)
    paragraphs = [" ".join(page) for page in pages]
    docx = documents.docx("Quarterly report", paragraphs)
    lines = TEXT_BYTES // len(_line(0, 0)) + 1
    text = "\n".join(_line(n // LINES_PER_PAGE, n % LINES_PER_PAGE) for n in range(lines))[
        :TEXT_BYTES
    ].encode()
    html = (
        "<html><body>"
        + "".join(f"<h2>Page {p}</h2><p>{' '.join(page)}</p>" for p, page in enumerate(pages))
        + "</body></html>"
    ).encode()
    return {
        "pdf": (pdf, "application/pdf", {"pages": PDF_PAGES, "bytes": len(pdf)}),
        "docx": (docx, DOCX_TYPE, {"pages": PDF_PAGES, "bytes": len(docx)}),
        "html": (html, "text/html", {"pages": PDF_PAGES, "bytes": len(html)}),
        "text": (text, "text/plain", {"bytes": len(text)}),
    }


def ingestion_figures(repeat: int = 5) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    split_by_tokens("load the tokenizer once, as a worker has", chunk_tokens=CHUNK_TOKENS)
    for name, (data, media_type, size) in corpus().items():
        seconds, parse_seconds, chunk_count = [], [], 0
        parse_bounded(data, media_type, timeout=120)  # warm-up: the page cache, the interpreter's imports
        for _ in range(repeat):
            started = time.perf_counter()
            text = parse_bounded(data, media_type, timeout=120)
            parsed = time.perf_counter()
            chunk_count = len(split_by_tokens(text, chunk_tokens=CHUNK_TOKENS))
            seconds.append(time.perf_counter() - started)
            parse_seconds.append(parsed - started)
        median = statistics.median(seconds)
        figure = {
            "seconds_p50": round(median, 3),
            "parse_seconds_p50": round(statistics.median(parse_seconds), 3),
            "spread_s": round(max(seconds) - min(seconds), 3),
            "mb_per_s": round(size["bytes"] / 1024**2 / median, 2),
            "chunks": chunk_count,
            "text_bytes": len(text.encode()),
            "n": repeat,
            **size,
        }
        if "pages" in size:
            figure["pages_per_s"] = round(size["pages"] / median, 1)
        figures[name] = figure
    return figures


def table_rows(figures: dict[str, Any]) -> list[tuple[str, Any, Any, str, str]]:
    """(figure, value, spread, unit, bar) rows for bench/run.py's table."""
    rows: list[tuple[str, Any, Any, str, str]] = []
    for name, fig in figures.items():
        what = f"{fig['pages']} pages, " if "pages" in fig else ""
        label = f"ingest {name} ({what}{fig['bytes'] / 1024**2:.1f} MiB -> {fig['chunks']} chunks)"
        rows.append((f"{label}: parse + chunk", fig["seconds_p50"] * 1000, fig["spread_s"] * 1000, "ms", ""))
        if "pages_per_s" in fig:
            rows.append((f"ingest {name}: pages/s", fig["pages_per_s"], "", "pages/s", ""))
        rows.append((f"ingest {name}: MiB/s of upload", fig["mb_per_s"], "", "MiB/s", ""))
    return rows
