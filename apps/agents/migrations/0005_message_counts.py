"""Stored messages per agent (default conversation) and per conversation, kept by statement-level triggers
on agents_message (one update per statement, so a bulk insert costs one), filled for existing rows.

The loop shows the recall count in every system message; counting an agent's messages at the start of
every run grew with them (an index-only scan: ~10 ms at 100k messages). Messages are only inserted and
deleted as a whole (their agent and conversation never change), so only those two events are counted.
"""

from django.db import migrations, models

COUNT_FUNCTION = """
CREATE FUNCTION agents_message_counts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE agents_agent AS a SET message_count = a.message_count + d.n
        FROM (SELECT agent_id, count(*) AS n FROM new_rows WHERE conversation_id IS NULL GROUP BY agent_id) AS d
        WHERE a.id = d.agent_id;
        UPDATE agents_conversation AS c SET message_count = c.message_count + d.n
        FROM (SELECT conversation_id, count(*) AS n FROM new_rows WHERE conversation_id IS NOT NULL
              GROUP BY conversation_id) AS d
        WHERE c.id = d.conversation_id;
    ELSE
        UPDATE agents_agent AS a SET message_count = a.message_count - d.n
        FROM (SELECT agent_id, count(*) AS n FROM old_rows WHERE conversation_id IS NULL GROUP BY agent_id) AS d
        WHERE a.id = d.agent_id;
        UPDATE agents_conversation AS c SET message_count = c.message_count - d.n
        FROM (SELECT conversation_id, count(*) AS n FROM old_rows WHERE conversation_id IS NOT NULL
              GROUP BY conversation_id) AS d
        WHERE c.id = d.conversation_id;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER agents_message_counts_insert AFTER INSERT ON agents_message
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION agents_message_counts();
CREATE TRIGGER agents_message_counts_delete AFTER DELETE ON agents_message
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION agents_message_counts();
"""
DROP_COUNT_FUNCTION = "DROP FUNCTION agents_message_counts() CASCADE;"

FILL = """
UPDATE agents_agent AS a SET message_count = d.n
FROM (SELECT agent_id, count(*) AS n FROM agents_message WHERE conversation_id IS NULL GROUP BY agent_id) AS d
WHERE a.id = d.agent_id;
UPDATE agents_conversation AS c SET message_count = d.n
FROM (SELECT conversation_id, count(*) AS n FROM agents_message WHERE conversation_id IS NOT NULL
      GROUP BY conversation_id) AS d
WHERE c.id = d.conversation_id;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0004_step_trace_compressed"),
    ]

    operations = [
        migrations.AddField(
            model_name="agent",
            name="message_count",
            field=models.BigIntegerField(
                default=0,
                editable=False,
                help_text="Stored messages of the default conversation, kept by a database trigger (migration 0005).",
            ),
        ),
        migrations.AddField(
            model_name="conversation",
            name="message_count",
            field=models.BigIntegerField(
                default=0, editable=False, help_text="Stored messages, kept by a database trigger (migration 0005)."
            ),
        ),
        migrations.RunSQL(COUNT_FUNCTION, DROP_COUNT_FUNCTION),
        migrations.RunSQL(FILL, migrations.RunSQL.noop),
    ]
