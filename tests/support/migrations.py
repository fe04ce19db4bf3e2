"""Running a data migration in a test: migrate back, write rows the old way, migrate forward, and
always leave the database at the latest migrations for the tests that follow."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.apps.registry import Apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor


@contextmanager
def migrated_from(
    before: list[tuple[str, str | None]],
) -> Iterator[tuple[Apps, Callable[..., None]]]:
    """Yields (the models as of `before`, a function that migrates forward to a target, or to the latest
    migrations when given none). `(app, None)` in `before`: the app not migrated at all."""
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    executor.migrate(before)

    def forward(target: list[tuple[str, str]] | None = None) -> None:
        """Migrate to `target`; None: to the latest migrations, where the current models can read."""
        step = MigrationExecutor(connection)
        step.migrate(latest if target is None else target)

    try:
        nodes = [(app, name) for app, name in before if name is not None]
        yield executor.loader.project_state(nodes).apps, forward
    finally:
        MigrationExecutor(connection).migrate(latest)
