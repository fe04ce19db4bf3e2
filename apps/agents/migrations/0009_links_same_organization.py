"""An agent uses only tools and archives of its own organisation: row triggers refuse an agents_agenttool or
agents_agent_archives row whose two ends belong to different organisations, whoever writes it (services, the
admin, an import, raw SQL). The same rule for blocks is memory's migration 0004.

A row naming a row that does not exist (yet) passes here: the foreign keys, checked at commit, refuse it if it
still does not."""

from django.db import migrations

# (link table, trigger function, the other end's table, its column in the link table, what it is called)
LINKS = [
    ("agents_agenttool", "agents_agenttool_same_organization", "tools_tool", "tool_id", "tool"),
    (
        "agents_agent_archives",
        "agents_agent_archives_same_organization",
        "memory_archive",
        "archive_id",
        "archive",
    ),
]


def _create(table: str, function: str, other_table: str, column: str, noun: str) -> str:
    return f"""
CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    agent_org text;
    other_org text;
BEGIN
    SELECT organization_id INTO agent_org FROM agents_agent WHERE id = NEW.agent_id;
    SELECT organization_id INTO other_org FROM {other_table} WHERE id = NEW.{column};
    IF agent_org <> other_org THEN
        RAISE EXCEPTION '{noun} % belongs to another organization than agent %', NEW.{column}, NEW.agent_id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER {function}
    BEFORE INSERT OR UPDATE OF agent_id, {column} ON {table}
    FOR EACH ROW EXECUTE FUNCTION {function}();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0008_message_otid_once"),
        ("memory", "0001_initial"),
        ("tools", "0001_initial"),
    ]

    operations = [migrations.RunSQL(_create(*link), f"DROP FUNCTION {link[1]}() CASCADE;") for link in LINKS]
