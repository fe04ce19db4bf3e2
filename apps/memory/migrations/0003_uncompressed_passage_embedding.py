"""Passage embeddings out of line without a compression attempt.

Embedding floats do not compress, yet a 1536-dimension vector (6 kB) makes its row long enough for
PostgreSQL to try pglz on it at every insert: inserting 100 such vectors took 32.6 ms, 29.1 ms with
STORAGE EXTERNAL (bench/RESULTS.md). Vectors of up to ~500 dimensions stay inline either way.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("memory", "0002_archive_stats")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE memory_passage ALTER COLUMN embedding SET STORAGE EXTERNAL;",
            "ALTER TABLE memory_passage ALTER COLUMN embedding SET STORAGE EXTENDED;",
        )
    ]
