"""Drop the `varchar_pattern_ops` twins of the id indexes on the tables a turn writes.

On PostgreSQL Django gives every indexed varchar column (each primary key and foreign key here: ids are
varchar) a second index for `LIKE 'prefix%'`, which nothing asks of an id. A turn inserts a run, its
steps, messages, LLM call records and its trace and updates some of them, so every row paid for 4-6 extra
b-tree entries: 9-26 us of PostgreSQL CPU a row, 7-13% of a single-row insert (bench/RESULTS.md,
2026-12-07), and their disk and WAL. tests/agents/test_pattern_indexes.py keeps them gone. Reversible:
Django's own index names come back.
"""

from django.db import migrations

TABLES = (
    "agents_agent",
    "agents_conversation",
    "agents_run",
    "agents_step",
    "agents_message",
    "llm_llmcall",
    "memory_block",
    "memory_blockhistory",
    "memory_passage",
    "observability_runtrace",
)


def drop_pattern_indexes(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = ANY(%s) "
            "AND indexdef LIKE '%%varchar_pattern_ops%%'",
            [list(TABLES)],
        )
        names = [name for (name,) in cursor.fetchall()]
    for name in names:
        schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(name)}")


def restore_pattern_indexes(apps, schema_editor):
    """Django's `_like` index of each indexed id column, under the name Django gives it."""
    for model in apps.get_models():
        if model._meta.db_table not in TABLES:
            continue
        for field in model._meta.local_fields:
            statement = schema_editor._create_like_index_sql(model, field)
            if statement is not None:
                schema_editor.execute(str(statement).replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS", 1))


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0015_message_ids_read_joined"),
        ("llm", "0003_llm_call_bodies_compressed"),
        ("memory", "0006_git_memory_repository"),
        ("observability", "0001_run_trace"),
    ]

    operations = [migrations.RunPython(drop_pattern_indexes, restore_pattern_indexes)]
