"""Uploaded files to text: which types a folder takes, and a parser for each.

Formats: plain text, Markdown, JSON, CSV, HTML and source code (decoded as text; HTML stripped to its text
by the standard library's parser), PDF (pypdf: pure Python, no native PDF engine), DOCX (python-docx:
paragraphs in order, headings as Markdown, tables as rows). Why not markitdown: its closure brings
onnxruntime, numpy and an ML model to sniff file types, pdfminer, pdfplumber, PDFium and Pillow; these two
libraries (pypdf, python-docx with lxml) cover the formats we take.

Hostile files: HTML, PDF and DOCX are parsed by this module's `main`, run as a script (it imports only the
standard library at load time) in the parser jail, under memory, CPU and time limits, with a cap on the
text it may return (apps/folders/isolation.py). A DOCX (a zip) is refused before it is opened when its
members would inflate past DOCX_MAX_INFLATED_BYTES or inflate suspiciously far (a zip bomb); pypdf caps
each decompressed stream itself (75 MB), and the memory limit catches whatever else inflates. Whatever goes
wrong ends as ParseFailed with a reason a user can read.
"""

from __future__ import annotations

import io
import json
import mimetypes
import os
import sys
import zipfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import PurePath

PARSE_MEMORY_BYTES = 2 * 1024**3
"""Address space the parsing child may map (RLIMIT_AS): a bomb that inflates past it fails to allocate."""
MAX_TEXT_BYTES = 64 * 1024 * 1024
"""Most text (UTF-8) a parse may return; past it the file is refused as too large once parsed."""
DOCX_MAX_INFLATED_BYTES = 256 * 1024 * 1024
DOCX_MAX_RATIO = 200
"""A zip member that inflates more than this many times its stored size (and past 1 MiB) is a bomb."""
DOCX_MAX_MEMBERS = 10_000
PDF_MAX_PAGES = 10_000
EXIT_PARSE_FAILED = 3


class ParseFailed(Exception):
    """The file could not be turned into text; `reason` says why, for the file's error_message."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class FileType:
    extension: str
    mime_type: str
    kind: str  # "text", "html", "pdf", "docx"
    lines: (
        str  # how open_files numbers it: "code", "structured", "documentation", "lines" (Letta's strategies)
    )


_TYPES = [
    FileType(".pdf", "application/pdf", "pdf", "lines"),
    FileType(
        ".docx", "application/vnd.openxmlformats-officedocument.wordprocessingml.document", "docx", "lines"
    ),
    FileType(".txt", "text/plain", "text", "lines"),
    FileType(".md", "text/markdown", "text", "documentation"),
    FileType(".markdown", "text/markdown", "text", "documentation"),
    FileType(".json", "application/json", "text", "structured"),
    FileType(".jsonl", "application/jsonl", "text", "structured"),
    FileType(".csv", "text/csv", "text", "structured"),
    FileType(".html", "text/html", "html", "code"),
    FileType(".htm", "text/html", "html", "code"),
    FileType(".xml", "application/xml", "text", "structured"),
    FileType(".yaml", "text/x-yaml", "text", "structured"),
    FileType(".yml", "text/x-yaml", "text", "structured"),
    FileType(".toml", "application/toml", "text", "structured"),
    FileType(".ini", "text/x-ini", "text", "structured"),
    FileType(".cfg", "text/x-conf", "text", "structured"),
    FileType(".conf", "text/x-conf", "text", "structured"),
    FileType(".css", "text/css", "text", "structured"),
    FileType(".py", "text/x-python", "text", "code"),
    FileType(".js", "text/javascript", "text", "code"),
    FileType(".ts", "text/x-typescript", "text", "code"),
    FileType(".jsx", "text/x-jsx", "text", "code"),
    FileType(".tsx", "text/x-tsx", "text", "code"),
    FileType(".java", "text/x-java-source", "text", "code"),
    FileType(".c", "text/x-c", "text", "code"),
    FileType(".h", "text/x-c", "text", "code"),
    FileType(".cpp", "text/x-c++", "text", "code"),
    FileType(".cs", "text/x-csharp", "text", "code"),
    FileType(".go", "text/x-go", "text", "code"),
    FileType(".rs", "text/x-rust", "text", "code"),
    FileType(".rb", "text/x-ruby", "text", "code"),
    FileType(".php", "text/x-php", "text", "code"),
    FileType(".swift", "text/x-swift", "text", "code"),
    FileType(".kt", "text/x-kotlin", "text", "code"),
    FileType(".scala", "text/x-scala", "text", "code"),
    FileType(".r", "text/x-r", "text", "code"),
    FileType(".sh", "text/x-shellscript", "text", "code"),
    FileType(".sql", "text/x-sql", "text", "code"),
]
BY_EXTENSION = {t.extension: t for t in _TYPES}
BY_MIME = {t.mime_type: t for t in reversed(_TYPES)}  # the first extension listed wins
ALIASES = {
    "text/x-markdown": "text/markdown",
    "application/x-jsonlines": "application/jsonl",
    "text/xml": "application/xml",
    "application/x-yaml": "text/x-yaml",
    "text/x-script.python": "text/x-python",
}
SUPPORTED_SUMMARY = "PDF, DOCX, text (.txt, .md), JSON, CSV, HTML, XML, YAML and source code files"


def media_type_for(filename: str | None, content_type: str | None) -> str | None:
    """The upload's media type, as Letta decides it: the Content-Type the client sent (without parameters)
    when we take it, else a guess from the file name, else its extension; None: not a type we take."""
    declared = (content_type or "").split(";", 1)[0].strip().lower()
    declared = ALIASES.get(declared, declared)
    if declared in BY_MIME:
        return declared
    if filename:
        extension = PurePath(filename).suffix.lower()
        if extension in BY_EXTENSION:
            return BY_EXTENSION[extension].mime_type
        guessed = ALIASES.get(
            mimetypes.guess_type(filename)[0] or "", mimetypes.guess_type(filename)[0] or ""
        )
        if guessed in BY_MIME:
            return guessed
    return None


def file_type(media_type: str) -> FileType:
    return BY_MIME.get(ALIASES.get(media_type, media_type), BY_MIME["text/plain"])


# --- the parsers (run in the child) ---------------------------------------------------------------------


def parse(data: bytes, media_type: str) -> str:
    """The file's text. Raises ParseFailed. Unbounded by itself: call parse_bounded for uploads."""
    kind = file_type(media_type).kind
    if kind == "pdf":
        return _pdf_text(data)
    if kind == "docx":
        return _docx_text(data)
    text = _decode(data)
    return _html_text(text) if kind == "html" else text


def _decode(data: bytes) -> str:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise ParseFailed(f"The file is not valid UTF-16 text: {exc}") from exc
    if b"\x00" in data[:8192]:
        raise ParseFailed("The file looks binary (it holds NUL bytes), not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("cp1252", errors="replace")


def _pdf_text(data: bytes) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    if not data.lstrip()[:5].startswith(b"%PDF"):
        raise ParseFailed("The file is not a PDF (it does not start with %PDF)")
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted and not reader.decrypt(""):
            raise ParseFailed("The PDF is encrypted with a password")
        if len(reader.pages) > PDF_MAX_PAGES:
            raise ParseFailed(f"The PDF has {len(reader.pages)} pages; at most {PDF_MAX_PAGES} are read")
        pages = [page.extract_text() or "" for page in reader.pages]
    except ParseFailed:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, IndexError, OSError) as exc:
        raise ParseFailed(f"The PDF could not be read: {type(exc).__name__}: {exc}") from exc
    return "\n\n".join(page.strip() for page in pages if page.strip())


def _docx_text(data: bytes) -> str:
    _refuse_zip_bomb(data)
    from docx import Document
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    try:
        document = Document(io.BytesIO(data))
        lines: list[str] = []
        for item in document.iter_inner_content():
            if isinstance(item, Paragraph):
                lines.append(_docx_paragraph(item))
            elif isinstance(item, Table):
                lines.extend(" | ".join(cell.text.strip() for cell in row.cells) for row in item.rows)
    except (ValueError, KeyError, AttributeError, zipfile.BadZipFile) as exc:
        raise ParseFailed(f"The DOCX could not be read: {type(exc).__name__}: {exc}") from exc
    return "\n".join(line for line in lines if line.strip())


def _docx_paragraph(paragraph: object) -> str:
    text = paragraph.text.strip()  # type: ignore[attr-defined]
    style = (getattr(getattr(paragraph, "style", None), "name", "") or "").lower()
    if text and style.startswith("heading"):
        level = style.removeprefix("heading").strip()
        return "#" * (int(level) if level.isdigit() and 0 < int(level) < 7 else 1) + " " + text
    if text and style.startswith("list"):
        return f"- {text}"
    return text


def _refuse_zip_bomb(data: bytes) -> None:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise ParseFailed("The file is not a DOCX (not a zip archive)") from exc
    members = archive.infolist()
    if len(members) > DOCX_MAX_MEMBERS:
        raise ParseFailed(f"The DOCX holds {len(members)} parts; at most {DOCX_MAX_MEMBERS} are accepted")
    inflated = sum(member.file_size for member in members)
    if inflated > DOCX_MAX_INFLATED_BYTES:
        raise ParseFailed(
            f"The DOCX would inflate to {inflated:,} bytes; at most {DOCX_MAX_INFLATED_BYTES:,} are accepted"
        )
    for member in members:
        if member.file_size > 1024 * 1024 and member.file_size > DOCX_MAX_RATIO * max(
            member.compress_size, 1
        ):
            raise ParseFailed(f"The DOCX part {member.filename} inflates suspiciously far (a zip bomb?)")
    if "word/document.xml" not in {member.filename for member in members}:
        raise ParseFailed("The file is not a DOCX (no word/document.xml)")


BLOCK_TAGS = frozenset(
    [
        "p",
        "div",
        "br",
        "li",
        "tr",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "pre",
        "blockquote",
        "section",
        "article",
        "header",
        "footer",
        "table",
        "ul",
        "ol",
        "dt",
        "dd",
    ]
)
SKIPPED_TAGS = frozenset({"script", "style", "noscript", "template", "head"})


class _TextOfHtml(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in SKIPPED_TAGS:
            self.skipping += 1
        elif tag in BLOCK_TAGS:
            self.parts.append("\n")
            if tag[0] == "h" and tag[1:].isdigit():
                self.parts.append("#" * int(tag[1:]) + " ")
            elif tag == "li":
                self.parts.append("- ")

    def handle_endtag(self, tag: str) -> None:
        if tag in SKIPPED_TAGS:
            self.skipping = max(0, self.skipping - 1)
        elif tag in BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)


def _html_text(html: str) -> str:
    parser = _TextOfHtml()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)


# --- the child's entry point (apps/folders/isolation.py runs this module's source) ---------------------


def main() -> None:
    """The child: one header line (JSON) first, then the file on stdin; the text on stdout. The header
    names the site-packages to import the parsers from (in the jail) or the limits to set on itself
    (FOLDER_PARSE_ISOLATION=process), before a byte of the file is read."""
    import logging
    import resource
    import warnings

    logging.disable(logging.CRITICAL)  # pypdf logs what it tolerates; only our reason goes to stderr
    warnings.simplefilter("ignore")
    header_line = sys.stdin.buffer.readline()
    header = json.loads(header_line)
    sys.path[:0] = header.get("sys_path", [])
    if "memory" in header:
        resource.setrlimit(resource.RLIMIT_AS, (header["memory"], header["memory"]))
        resource.setrlimit(resource.RLIMIT_CPU, (header["cpu"], header["cpu"]))
    data = sys.stdin.buffer.read()
    try:
        text = parse(data, header["media_type"])
    except ParseFailed as exc:
        _fail(exc.reason)
    except MemoryError:
        _fail(
            f"Parsing needed more than {PARSE_MEMORY_BYTES // 1024**2} MiB of memory (a decompression bomb?)"
        )
    except Exception as exc:  # a parser's own bug on a malformed file: say what, then stop
        _fail(f"The file could not be parsed: {type(exc).__name__}: {str(exc)[:500]}")
    encoded = text.replace("\x00", "").encode("utf-8", errors="replace")
    sys.stdout.buffer.write(encoded[: MAX_TEXT_BYTES + 1])


def _fail(reason: str) -> None:
    sys.stderr.write(reason)
    sys.stderr.flush()
    os._exit(EXIT_PARSE_FAILED)


if __name__ == "__main__":
    main()
