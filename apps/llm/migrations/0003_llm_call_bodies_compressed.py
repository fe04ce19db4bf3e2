"""An LLM call record's request and response are stored zlib-compressed (apps.core.models.CompressedTextField):
PostgreSQL compressed the text with pglz at every insert, most of the record's cost (bench/RESULTS.md,
2026-12-07). The columns become bytea; existing rows keep their text as UTF-8 bytes, which the field reads
as before, and are not rewritten. Stored as they come (STORAGE EXTERNAL): zlib's bytes do not compress
again. Reversible: compressed rows are expanded to UTF-8 first, then the columns become text again."""

import zlib

from django.db import migrations

import apps.core.models

COLUMNS = ("request_body", "response_body")
BATCH = 500


def _alter(to: str) -> str:
    using = "convert_to({column}, 'UTF8')" if to == "bytea" else "convert_from({column}, 'UTF8')"
    parts = [f"ALTER COLUMN {c} TYPE {to} USING {using.format(column=c)}" for c in COLUMNS]
    storage = "EXTERNAL" if to == "bytea" else "EXTENDED"
    parts += [f"ALTER COLUMN {c} SET STORAGE {storage}" for c in COLUMNS]
    return "ALTER TABLE llm_llmcall " + ", ".join(parts)


def expand_compressed_rows(apps, schema_editor):
    """Reverse only: zlib streams back to UTF-8 bytes, so that the columns can become text."""
    connection = schema_editor.connection
    for column in COLUMNS:
        after = ""
        while True:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT id, {column} FROM llm_llmcall WHERE id > %s "
                    f"AND substring({column} FROM 1 FOR 1) = '\\x78'::bytea ORDER BY id LIMIT {BATCH}",
                    [after],
                )
                rows = cursor.fetchall()
                for row_id, data in rows:
                    after = row_id
                    cursor.execute(
                        f"UPDATE llm_llmcall SET {column} = %s WHERE id = %s", [zlib.decompress(bytes(data)), row_id]
                    )
            if len(rows) < BATCH:
                break
    with connection.cursor() as cursor:  # the updates' deferred checks, before the table is altered
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


class Migration(migrations.Migration):
    dependencies = [
        ("llm", "0002_llm_call_records"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(_alter("bytea"), _alter("text"))],
            state_operations=[
                migrations.AlterField(
                    model_name="llmcall",
                    name=column,
                    field=apps.core.models.CompressedTextField(blank=True, default=""),
                )
                for column in COLUMNS
            ],
        ),
        migrations.RunPython(migrations.RunPython.noop, expand_compressed_rows),
    ]
