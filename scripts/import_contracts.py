"""import-linter contract types of our own (registered in pyproject.toml's `contract_types`).

`public_surface`: the adapters (apps.api, apps.ade) import from the other apps only what those apps offer
them — each app's `services`, `selectors`, `models` and `errors` (and their submodules, should one become a
package), plus a few named public modules (apps.agents.wire, ...). The kernel (apps.core) is open to them
as a whole. import-linter's built-in types can forbid named modules but not "everything except these", so
a new internal module (a new `apps.agents.loop.x`) would slip past a `forbidden` list; this contract
allows rather than forbids, and so covers modules nobody has listed yet. Only direct imports count: what a
service imports in turn is that app's business.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

import grimp
from importlinter import Contract, ContractCheck, fields, output
from importlinter.application import contract_utils
from importlinter.contracts._common import Link
from importlinter.domain import helpers
from importlinter.domain.imports import ImportExpression, ModuleExpression


class PublicSurfaceContract(Contract):
    """Adapters import another app only through its public surface.

    Options:
        - adapters:          packages whose imports are checked (with their descendants); they may
                             import each other freely.
        - apps:              the apps whose surface is guarded; wildcards allowed (`apps.*`). The
                             adapters and the kernel are left out of it.
        - kernel:            packages the adapters may import wholly (optional).
        - public_submodules: the names of each app's public submodules (`services`, `selectors`, ...);
                             their descendants are public too.
        - public_modules:    further public modules, by full name (descendants included; optional).
        - ignore_imports:    imports to leave out of the check, as in the built-in contracts (optional).
        - unmatched_ignore_imports_alerting: none, warn or error (the default) for an ignored import
                             that is not in the graph.
        - broken_contract_guidance: shown after the violations (optional).
    """

    type_name = "public_surface"

    adapters = fields.ListField(subfield=fields.ModuleExpressionField())
    apps = fields.ListField(subfield=fields.ModuleExpressionField())
    kernel = fields.ListField(subfield=fields.ModuleExpressionField(), required=False, default=[])
    public_submodules = fields.ListField(subfield=fields.StringField())
    public_modules = fields.ListField(subfield=fields.StringField(), required=False, default=[])
    ignore_imports = fields.SetField(subfield=fields.ImportExpressionField(), required=False)
    unmatched_ignore_imports_alerting = fields.EnumField(
        contract_utils.AlertLevel, default=contract_utils.AlertLevel.ERROR
    )
    broken_contract_guidance = fields.TextField(required=False)

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        removal = contract_utils.remove_ignored_imports_and_report(
            graph=graph,
            ignore_imports=cast("Sequence[ImportExpression] | None", self.ignore_imports),
            unmatched_alerting=cast(contract_utils.AlertLevel, self.unmatched_ignore_imports_alerting),
        )
        adapters = _names(graph, cast("list[ModuleExpression]", self.adapters))
        kernel = _names(graph, cast("list[ModuleExpression]", self.kernel))
        guarded = _names(graph, cast("list[ModuleExpression]", self.apps)) - adapters - kernel
        public_modules = cast("list[str]", self.public_modules)
        warnings = list(removal.warnings)
        warnings += [
            f"Public module {name} is not in the graph."
            for name in public_modules
            if name not in graph.modules
        ]
        links = surface_violations(
            graph,
            adapters=adapters,
            apps=guarded,
            public_submodules=cast("list[str]", self.public_submodules),
            public_modules=public_modules,
        )
        return ContractCheck(
            kept=not links,
            warnings=warnings,
            ignored_import_count=removal.ignored_import_count,
            metadata={"links": links},
        )

    def render_broken_contract(self, check: ContractCheck) -> None:
        output.print_error("Imports of another app's internal modules:", bold=False)
        output.new_line()
        for link in check.metadata["links"]:
            lines = ", ".join(str(number) for number in link["line_numbers"])
            output.print_error(f"- {link['importer']} -> {link['imported']} (l.{lines})", bold=False)
        output.new_line()
        contract_utils.render_broken_contract_guidance(cast("str | None", self.broken_contract_guidance))


def surface_violations(
    graph: grimp.ImportGraph,
    *,
    adapters: Iterable[str],
    apps: Iterable[str],
    public_submodules: Iterable[str],
    public_modules: Iterable[str],
) -> list[Link]:
    """Every direct import, by an adapter module, of a module of one of `apps` that is not public: not in a
    public submodule of its app nor in a public module (each with its descendants). An app's package
    itself (its `__init__`) is not public. Sorted by importer, then imported."""
    importers = _with_descendants(graph, adapters)
    guarded = sorted(apps, key=len, reverse=True)  # the innermost app first, should apps nest
    submodules = set(public_submodules)
    modules = tuple(public_modules)
    links: list[Link] = []
    for importer in sorted(importers):
        for imported in sorted(graph.find_modules_directly_imported_by(importer) - importers):
            app = next((app for app in guarded if _within(imported, app)), None)
            if app is None:
                continue  # not a guarded app's: the kernel, another adapter
            if _is_public(imported, app=app, submodules=submodules, modules=modules):
                continue
            details = graph.get_import_details(importer=importer, imported=imported)
            links.append(
                {
                    "importer": importer,
                    "imported": imported,
                    "line_numbers": tuple(detail["line_number"] for detail in details),
                }
            )
    return links


def _names(graph: grimp.ImportGraph, expressions: list[ModuleExpression]) -> set[str]:
    modules = helpers.module_expressions_to_modules(graph=graph, expressions=expressions, as_packages=False)
    return {module.name for module in modules}


def _with_descendants(graph: grimp.ImportGraph, packages: Iterable[str]) -> set[str]:
    names: set[str] = set()
    for package in packages:
        if package not in graph.modules:
            continue
        names.add(package)
        if not graph.is_module_squashed(package):
            names |= graph.find_descendants(package)
    return names


def _is_public(module: str, *, app: str, submodules: set[str], modules: tuple[str, ...]) -> bool:
    if any(_within(module, public) for public in modules):
        return True
    inside = module[len(app) + 1 :]  # "" for the app's package itself
    return bool(inside) and inside.split(".")[0] in submodules


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")
