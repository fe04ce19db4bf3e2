"""Store in-context id lists and provider traces out of line without trying to compress them.

PostgreSQL tries pglz on any value that makes a row longer than ~2 kB. An in-context id list (ids are
random hex) does not compress, so every append paid for a failed compression of the whole list before
storing it uncompressed anyway: 1.46 ms per append at 800 ids, 4.75 ms at 3,000, against 0.55 and 1.13 ms
with STORAGE EXTERNAL (bench/RESULTS.md). A run appends two or three times. A step's trace is zlib bytes
already. Only values written from now on are affected; existing ones are read as they are.
"""

from django.db import migrations

TABLE_COLUMNS = [
    ("agents_agent", "message_ids"),
    ("agents_conversation", "message_ids"),
    ("agents_step", "trace"),
]


def _storage(mode: str) -> str:
    return "\n".join(
        f"ALTER TABLE {table} ALTER COLUMN {column} SET STORAGE {mode};" for table, column in TABLE_COLUMNS
    )


class Migration(migrations.Migration):
    dependencies = [("agents", "0005_message_counts")]

    operations = [migrations.RunSQL(_storage("EXTERNAL"), _storage("EXTENDED"))]
