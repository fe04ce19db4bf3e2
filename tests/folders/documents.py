"""Small real documents the folder tests upload, made here: a PDF written object by object (one page per
entry, Helvetica text), a DOCX written by python-docx, and the text formats."""

from __future__ import annotations

import io
import zipfile


def pdf(pages: list[list[str]]) -> bytes:
    """A valid PDF 1.4 with one page per entry, each line of text drawn on its own line."""
    objects: list[bytes] = []
    page_ids = [4 + 2 * i for i in range(len(pages))]
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    kids = " ".join(f"{i} 0 R" for i in page_ids)
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode())
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, lines in enumerate(pages):
        content_id = page_ids[i] + 1
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
            f"/Contents {content_id} 0 R >>".encode()
        )
        ops = ["BT", "/F1 12 Tf", "14 TL", "72 720 Td"]
        for line in lines:
            escaped = line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
            ops += [f"({escaped}) Tj", "T*"]
        ops.append("ET")
        stream = "\n".join(ops).encode("latin-1")
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


def docx(heading: str, paragraphs: list[str], table: list[list[str]] | None = None) -> bytes:
    from docx import Document

    document = Document()
    document.add_heading(heading, level=1)
    for paragraph in paragraphs:
        document.add_paragraph(paragraph)
    if table:
        grid = document.add_table(rows=len(table), cols=len(table[0]))
        for r, row in enumerate(table):
            for c, cell in enumerate(row):
                grid.cell(r, c).text = cell
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def zip_bomb_docx() -> bytes:
    """A "DOCX" whose document part inflates from a few kB to 300 MiB of zeros."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        with archive.open("word/document.xml", "w", force_zip64=True) as member:
            block = b"\0" * (1024 * 1024)
            for _ in range(300):
                member.write(block)
    return out.getvalue()


HTML = b"""<!doctype html><html><head><title>t</title><style>p{color:red}</style></head>
<body><h1>Release notes</h1><p>The <b>aurora</b> build ships on Friday.</p><script>alert(1)</script>
<ul><li>faster search</li><li>fewer crashes</li></ul></body></html>"""
CSV = b"city,population\nLisbon,545000\nPorto,232000\n"
JSON = b'{"project": "aurora", "owner": "Sam", "tags": ["search", "speed"]}'
MARKDOWN = b"# Aurora\n\nAurora is the codename of the search rewrite. It ships on Friday.\n"
TEXT = b"Line one about apples.\nLine two about pears.\nLine three about plums.\n"
