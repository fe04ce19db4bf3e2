"""Migration agents 0016: the tables a turn writes keep no `varchar_pattern_ops` index (Django's `_like`
twin of each indexed id column, for LIKE queries nothing makes), and the migration can be undone."""

import importlib

import pytest
from django.db import connection

from tests.support.migrations import migrated_from

TABLES = importlib.import_module("apps.agents.migrations.0016_no_pattern_indexes_on_ids").TABLES


def pattern_indexes() -> list[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tablename, indexname FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename = ANY(%s) AND indexdef LIKE '%%pattern_ops%%' ORDER BY 1, 2",
            [list(TABLES)],
        )
        return cursor.fetchall()


def test_the_tables_a_turn_writes_have_no_pattern_index(db):
    assert pattern_indexes() == []


@pytest.mark.django_db(transaction=True)
def test_undoing_the_migration_brings_djangos_pattern_indexes_back():
    with migrated_from([("agents", "0015_message_ids_read_joined")]) as (_old_apps, forward):
        restored = pattern_indexes()
        assert {table for table, _ in restored} == set(TABLES)
        assert all(name.endswith("_like") for _, name in restored)
        forward()
        assert pattern_indexes() == []
