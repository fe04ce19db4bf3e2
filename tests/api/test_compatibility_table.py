"""The README's compatibility table is what the pinned SDK and this server's routes say today."""

from __future__ import annotations

from pathlib import Path

from scripts.compat_table import SdkMethod, sdk_methods, served, table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_table_is_current() -> None:
    assert table() in README.read_text(), "run: .venv/bin/python scripts/compat_table.py"


def test_the_table_reads_every_method_of_the_sdk() -> None:
    names = {method.name for method in sdk_methods()}

    assert {"client.agents.create", "client.agents.messages.stream", "client.tools.upsert"} <= names
    assert len(names) >= 120  # letta-client 1.12.1 has 128


def test_a_method_counts_as_served_only_when_its_route_and_verb_answer() -> None:
    assert served(SdkMethod("health", "GET", "/v1/health")) == "yes"
    assert served(SdkMethod("health", "DELETE", "/v1/health")) == "no"  # the route, not the verb
    assert served(SdkMethod("nowhere", "GET", "/v1/no-such-thing/{thing_id}")) == "no"
