"""Every thread (an agent's default thread, each conversation) gets its stored system message
(apps/agents/system_messages.py): a row with a negative sequence number, which the stored-message
counts leave out. Existing threads get one holding the agent's system prompt; their next run writes the
compiled prompt over it."""

import uuid

from django.db import migrations

COUNT_FUNCTION = """
CREATE OR REPLACE FUNCTION agents_message_counts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE agents_agent AS a SET message_count = a.message_count + d.n
        FROM (SELECT agent_id, count(*) AS n FROM new_rows WHERE conversation_id IS NULL AND sequence_id >= 0
              GROUP BY agent_id) AS d
        WHERE a.id = d.agent_id;
        UPDATE agents_conversation AS c SET message_count = c.message_count + d.n
        FROM (SELECT conversation_id, count(*) AS n FROM new_rows WHERE conversation_id IS NOT NULL
              AND sequence_id >= 0 GROUP BY conversation_id) AS d
        WHERE c.id = d.conversation_id;
    ELSE
        UPDATE agents_agent AS a SET message_count = a.message_count - d.n
        FROM (SELECT agent_id, count(*) AS n FROM old_rows WHERE conversation_id IS NULL AND sequence_id >= 0
              GROUP BY agent_id) AS d
        WHERE a.id = d.agent_id;
        UPDATE agents_conversation AS c SET message_count = c.message_count - d.n
        FROM (SELECT conversation_id, count(*) AS n FROM old_rows WHERE conversation_id IS NOT NULL
              AND sequence_id >= 0 GROUP BY conversation_id) AS d
        WHERE c.id = d.conversation_id;
    END IF;
    RETURN NULL;
END
$$;
"""

PREVIOUS_COUNT_FUNCTION = COUNT_FUNCTION.replace(" AND sequence_id >= 0", "").replace(
    "\n              AND sequence_id >= 0 GROUP BY", "\n              GROUP BY"
)

# apps.agents.system_messages.thread_system_message_id, frozen here: the ids must match it.
NAMESPACE = uuid.UUID("6f1b7f0e-3c0a-4a8e-9c51-2b7d3f4e8a10")


def _message_id(agent_id, conversation_id):
    thread = f"{agent_id}/{conversation_id or 'default'}"
    return f"message-{uuid.uuid5(NAMESPACE, thread)}"


INSERT = """
INSERT INTO agents_message (id, organization_id, agent_id, conversation_id, role, content, text, name,
    tool_call_id, approval_request_id, denial_reason, otid, sender_id, model, is_err, sequence_id,
    created_at, updated_at)
VALUES (%s, %s, %s, %s, 'system', jsonb_build_array(jsonb_build_object('type', 'text', 'text', %s::text)),
    %s, '', '', '', '', '', '', '', false, -nextval('agents_message_sequence'), %s, %s)
ON CONFLICT (id) DO NOTHING
"""


def add_system_messages(apps, schema_editor):
    Agent = apps.get_model("agents", "Agent")
    Conversation = apps.get_model("agents", "Conversation")
    rows = []
    for agent in Agent.all_objects.all().only("id", "organization_id", "system", "created_at").iterator():
        rows.append((_message_id(agent.id, None), agent.organization_id, agent.id, None, agent.system, agent.created_at))
    conversations = Conversation.all_objects.select_related("agent").only(
        "id", "organization_id", "agent_id", "created_at", "agent__system"
    )
    for conversation in conversations.iterator():
        rows.append(
            (
                _message_id(conversation.agent_id, conversation.id),
                conversation.organization_id,
                conversation.agent_id,
                conversation.id,
                conversation.agent.system,
                conversation.created_at,
            )
        )
    with schema_editor.connection.cursor() as cursor:
        cursor.executemany(
            INSERT,
            [(mid, org, agent, conv, text, text, at, at) for mid, org, agent, conv, text, at in rows],
        )


def remove_system_messages(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("DELETE FROM agents_message WHERE sequence_id < 0 AND role = 'system'")


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0009_links_same_organization"),
    ]

    operations = [
        migrations.RunSQL(COUNT_FUNCTION, PREVIOUS_COUNT_FUNCTION),
        migrations.RunPython(add_system_messages, remove_system_messages),
    ]
