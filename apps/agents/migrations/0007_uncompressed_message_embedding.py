"""Message embeddings out of line without a compression attempt, as agents 0006 does for id lists.

Embedding floats do not compress; a 1536-dimension vector (6 kB) makes its row long enough for
PostgreSQL to try pglz on it at every write, in vain (memory 0003 measures it for passages).
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("agents", "0006_uncompressed_toast")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE agents_message ALTER COLUMN embedding SET STORAGE EXTERNAL;",
            "ALTER TABLE agents_message ALTER COLUMN embedding SET STORAGE EXTENDED;",
        )
    ]
