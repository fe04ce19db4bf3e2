"""scripts/import_contracts.py: the adapters may import only the other apps' public surface."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

from scripts.import_contracts import surface_violations

ROOT = Path(__file__).resolve().parent.parent
APPS = ["apps.accounts", "apps.agents", "apps.memory"]
PUBLIC_SUBMODULES = ["services", "selectors", "models", "errors"]


def graph_of(*imports: tuple[str, str]) -> grimp.ImportGraph:
    """A graph holding these imports (importer, imported), each on line 1 of its importer."""
    graph = grimp.ImportGraph()
    for module in {name for pair in imports for name in pair}:
        parts = module.split(".")
        for depth in range(1, len(parts) + 1):
            graph.add_module(".".join(parts[:depth]))
    for importer, imported in imports:
        graph.add_import(importer=importer, imported=imported, line_number=1, line_contents="import")
    return graph


def violations(graph: grimp.ImportGraph) -> list[tuple[str, str]]:
    links = surface_violations(
        graph,
        adapters=["apps.api", "apps.ade"],
        apps=APPS,
        public_submodules=PUBLIC_SUBMODULES,
        public_modules=["apps.agents.wire"],
    )
    return [(link["importer"], link["imported"]) for link in links]


def test_the_public_surface_the_kernel_and_the_other_adapter_are_allowed():
    graph = graph_of(
        ("apps.api.views.agents", "apps.agents.services"),
        ("apps.api.views.agents", "apps.agents.selectors"),
        ("apps.api.views.agents", "apps.agents.errors"),
        ("apps.api.serializers.memory", "apps.memory.models.archive"),
        ("apps.api.sse", "apps.agents.wire"),
        ("apps.api.sse", "apps.core.pagination"),
        ("apps.ade.views.memory", "apps.api.serializers.memory"),
        ("apps.ade.views.memory", "apps.memory.selectors"),
    )

    assert violations(graph) == []


def test_an_internal_module_or_an_apps_package_itself_is_refused():
    graph = graph_of(
        ("apps.api.views.messages", "apps.agents.loop.convert"),
        ("apps.api.views.messages", "apps.agents.services"),
        ("apps.ade.views.memory", "apps.memory.archival"),
        ("apps.api.views.runs", "apps.agents"),
        ("apps.api.views.runs", "apps.agents.wire_extra"),
    )

    assert violations(graph) == [
        ("apps.ade.views.memory", "apps.memory.archival"),
        ("apps.api.views.messages", "apps.agents.loop.convert"),
        ("apps.api.views.runs", "apps.agents"),
        ("apps.api.views.runs", "apps.agents.wire_extra"),
    ]


def test_only_the_adapters_imports_are_checked():
    graph = graph_of(
        ("apps.agents.services", "apps.agents.loop.convert"),
        ("apps.accounts.services", "apps.memory.archival"),
    )

    assert violations(graph) == []


def test_lint_imports_runs_the_contract_from_its_configuration(tmp_path):
    """Through lint-imports on this tree, with apps.agents.wire left out of the public modules: the API's
    imports of it are reported, and apps.core (the kernel) is not."""
    config = tmp_path / "contracts.toml"
    config.write_text(
        """
[tool.importlinter]
root_packages = ["apps"]
contract_types = ["public_surface: scripts.import_contracts.PublicSurfaceContract"]

[[tool.importlinter.contracts]]
name = "surface"
type = "public_surface"
adapters = ["apps.api"]
apps = ["apps.*"]
kernel = ["apps.core"]
public_submodules = ["services", "selectors", "models", "errors"]
public_modules = ["apps.streams.events", "apps.streams.redis_client"]
"""
    )

    result = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )

    assert result.returncode == 1, result.stdout + result.stderr
    assert "Contracts: 0 kept, 1 broken." in result.stdout
    assert "- apps.api.sse -> apps.agents.wire (l." in result.stdout
    assert "apps.core" not in result.stdout.split("Broken contracts")[1]
