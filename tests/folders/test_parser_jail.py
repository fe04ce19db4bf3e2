"""The parser jail: HTML, PDF and DOCX are parsed where an exploited parser could reach nothing of the
platform (no network, none of its files or environment, limits), and where no jail can be made the
upload fails closed with a reason, unless the operator chose the weaker child process."""

from __future__ import annotations

import json
import os
import textwrap
import uuid

import pytest
from django.conf import settings

from apps.folders import isolation
from apps.folders.models import FileChunk
from apps.sandbox import jail
from tests.folders import documents

PROBE = textwrap.dedent(
    """
    import json, os, socket, sys
    probe = json.loads(sys.stdin.read())
    seen = {"uid": os.getuid(), "env": sorted(os.environ)}
    seen["paths"] = {p: os.path.exists(p) for p in probe["paths"]}
    def connect(host, port):
        try:
            socket.create_connection((host, port), timeout=2).close()
            return "connected"
        except OSError as exc:
            return type(exc).__name__
    seen["database"] = connect(probe["db_host"], probe["db_port"]) if probe["db_port"] else None
    seen["outside"] = connect("10.255.255.1", 80)
    seen["processes"] = len([pid for pid in os.listdir("/proc") if pid.isdigit()])
    print(json.dumps(seen))
    """
)


def probe_the_jail() -> dict:
    database = settings.DATABASES["default"]
    host = database.get("HOST") or ""
    secret_file = str(settings.DATA_DIR)
    probe = {
        "paths": [
            secret_file,
            str(settings.BASE_DIR / "config" / "settings.py"),
            host if host.startswith("/") else "",
        ],
        "db_host": host if host and not host.startswith("/") else "127.0.0.1",
        "db_port": int(database.get("PORT") or 0) if not host.startswith("/") else 0,
    }
    output = isolation.run_jailed_python(PROBE, json.dumps(probe).encode(), timeout=20, max_bytes=100_000)
    assert output.returncode == 0, output.stderr.decode()
    return json.loads(output.stdout)


def test_a_parser_in_the_jail_reaches_no_database_no_file_and_no_secret_of_the_platform():
    seen = probe_the_jail()

    assert seen["uid"] == jail.INSIDE_UID
    assert seen["env"] == ["HOME", "LANG", "PATH", "PWD", "PYTHONDONTWRITEBYTECODE"]
    assert not any(seen["paths"].values()), seen["paths"]  # DATA_DIR, the checkout, the DB's socket
    assert seen["database"] in (None, "ConnectionRefusedError")  # the jail's own loopback, not the host's
    assert seen["outside"] in ("OSError", "TimeoutError", "ConnectionRefusedError")
    assert seen["processes"] <= 3  # bwrap's init, the parser: none of the host's


def test_pdf_docx_and_html_are_parsed_in_the_jail(folder, upload, monkeypatch):
    calls = []
    real = isolation.run_jailed_python
    monkeypatch.setattr(isolation, "run_jailed_python", lambda *a, **k: calls.append(1) or real(*a, **k))

    pdf = upload(folder, "report.pdf", documents.pdf([["Revenue grew in Lisbon"]]))
    docx = upload(folder, "memo.docx", documents.docx("Memo", ["Launch on Friday."]))
    html = upload(folder, "page.html", documents.HTML, content_type="text/html")
    text = upload(folder, "notes.txt", documents.TEXT)

    assert [f.processing_status for f in (pdf, docx, html, text)] == ["completed"] * 4
    assert len(calls) == 3  # plain text is only decoded, by our own code, in this process


def test_without_a_jail_a_pdf_fails_closed_and_says_how_to_fix_it(folder, upload, monkeypatch):
    monkeypatch.setattr(jail, "bwrap_path", lambda: None)
    isolation.unavailable_reason.cache_clear()
    try:
        pdf = upload(folder, "report.pdf", documents.pdf([["Revenue grew in Lisbon"]]))
        text = upload(folder, "notes.txt", documents.TEXT)
    finally:
        isolation.unavailable_reason.cache_clear()

    assert pdf.processing_status == "error"
    assert pdf.error_message.startswith("PDF files cannot be parsed on this server: the parser jail needs")
    assert "FOLDER_PARSE_ISOLATION=process" in pdf.error_message
    assert not FileChunk.objects.unscoped().filter(file_id=pdf.id).exists()
    assert text.processing_status == "completed"


def test_the_operator_may_choose_the_plain_child_process_instead(folder, upload, monkeypatch, settings):
    settings.FOLDER_PARSE_ISOLATION = "process"
    monkeypatch.setattr(
        isolation, "run_jailed_python", lambda *a, **k: pytest.fail("the jail was used despite the setting")
    )

    pdf = upload(folder, "report.pdf", documents.pdf([["Revenue grew in Lisbon"]]))

    assert pdf.processing_status == "completed"
    assert "Lisbon" in FileChunk.objects.unscoped().filter(file_id=pdf.id).first().text


def test_a_parser_that_runs_away_is_killed_at_the_deadline():
    marker = f"runaway-{uuid.uuid4().hex}"
    spin = f"import os\nos.fork()  # {marker}\nwhile True:\n    pass\n"

    output = isolation.run_jailed_python(spin, b"", timeout=1, max_bytes=1000)

    assert output.timed_out
    assert not processes_mentioning(marker)  # the parser and its child: nothing left running


def processes_mentioning(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if marker.encode() in cmdline.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found
