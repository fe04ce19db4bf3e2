"""Passage count and tag counts per archive, kept by statement-level triggers on memory_passage (one
update per statement, so a 100-passage insert or a bulk COPY costs one), filled for existing archives."""

import django.db.models.deletion
from django.db import migrations, models

# Each statement's passages, grouped per archive (and tag): added for inserted rows, subtracted for deleted
# ones; an UPDATE does both (its archive or tags may change). Transition tables need one trigger per event.
STATS_FUNCTION = """
CREATE FUNCTION memory_passage_stats() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        UPDATE memory_archivestats AS s SET passage_count = s.passage_count - d.n
        FROM (SELECT archive_id, count(*) AS n FROM old_rows GROUP BY archive_id) AS d
        WHERE s.archive_id = d.archive_id;
        UPDATE memory_archivetag AS t SET passage_count = t.passage_count - d.n
        FROM (SELECT archive_id, tag, count(*) AS n FROM old_rows, unnest(tags) AS tag GROUP BY 1, 2) AS d
        WHERE t.archive_id = d.archive_id AND t.tag = d.tag;
        DELETE FROM memory_archivetag
        WHERE passage_count <= 0 AND archive_id IN (SELECT DISTINCT archive_id FROM old_rows);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO memory_archivestats (archive_id, passage_count)
        SELECT archive_id, count(*) FROM new_rows GROUP BY archive_id
        ON CONFLICT (archive_id)
        DO UPDATE SET passage_count = memory_archivestats.passage_count + excluded.passage_count;
        INSERT INTO memory_archivetag (archive_id, tag, passage_count)
        SELECT archive_id, tag, count(*) FROM new_rows, unnest(tags) AS tag GROUP BY 1, 2
        ON CONFLICT (archive_id, tag)
        DO UPDATE SET passage_count = memory_archivetag.passage_count + excluded.passage_count;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER memory_passage_stats_insert AFTER INSERT ON memory_passage
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION memory_passage_stats();
CREATE TRIGGER memory_passage_stats_delete AFTER DELETE ON memory_passage
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION memory_passage_stats();
CREATE TRIGGER memory_passage_stats_update AFTER UPDATE ON memory_passage
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION memory_passage_stats();
"""
DROP_STATS_FUNCTION = "DROP FUNCTION memory_passage_stats() CASCADE;"

FILL = """
INSERT INTO memory_archivestats (archive_id, passage_count)
SELECT archive_id, count(*) FROM memory_passage GROUP BY archive_id;
INSERT INTO memory_archivetag (archive_id, tag, passage_count)
SELECT archive_id, tag, count(*) FROM memory_passage, unnest(tags) AS tag GROUP BY 1, 2;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="ArchiveStats",
            fields=[
                (
                    "archive",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="stats",
                        serialize=False,
                        to="memory.archive",
                    ),
                ),
                ("passage_count", models.BigIntegerField(default=0)),
            ],
            options={
                "verbose_name_plural": "archive stats",
            },
        ),
        migrations.CreateModel(
            name="ArchiveTag",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("tag", models.CharField(max_length=100)),
                ("passage_count", models.BigIntegerField(default=0)),
                (
                    "archive",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="tag_counts",
                        to="memory.archive",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("archive", "tag"), name="archive_tag_unique")
                ],
            },
        ),
        # The lock keeps passages from being written between the fill and the triggers' creation.
        migrations.RunSQL("LOCK TABLE memory_passage IN SHARE ROW EXCLUSIVE MODE;", migrations.RunSQL.noop),
        migrations.RunSQL(STATS_FUNCTION, DROP_STATS_FUNCTION),
        migrations.RunSQL(FILL, migrations.RunSQL.noop),
    ]
