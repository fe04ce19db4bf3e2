"""An identity is linked only to agents and blocks of its own organisation: row triggers refuse an
identities_identity_agents or identities_identity_blocks row whose two ends belong to different organisations,
whoever writes it (services, the admin, raw SQL). The same rule as agents' migration 0009 and memory's 0004.

A row naming a row that does not exist (yet) passes here: the foreign keys, checked at commit, refuse it if it
still does not."""

from django.db import migrations

# (link table, trigger function, the other end's table, its column in the link table, what it is called)
LINKS = [
    (
        "identities_identity_agents",
        "identities_identity_agents_same_organization",
        "agents_agent",
        "agent_id",
        "agent",
    ),
    (
        "identities_identity_blocks",
        "identities_identity_blocks_same_organization",
        "memory_block",
        "block_id",
        "block",
    ),
]


def _create(table: str, function: str, other_table: str, column: str, noun: str) -> str:
    return f"""
CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    identity_org text;
    other_org text;
BEGIN
    SELECT organization_id INTO identity_org FROM identities_identity WHERE id = NEW.identity_id;
    SELECT organization_id INTO other_org FROM {other_table} WHERE id = NEW.{column};
    IF identity_org <> other_org THEN
        RAISE EXCEPTION '{noun} % belongs to another organization than identity %', NEW.{column}, NEW.identity_id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER {function}
    BEFORE INSERT OR UPDATE OF identity_id, {column} ON {table}
    FOR EACH ROW EXECUTE FUNCTION {function}();
"""


class Migration(migrations.Migration):
    dependencies = [("identities", "0001_initial")]

    operations = [migrations.RunSQL(_create(*link), f"DROP FUNCTION {link[1]}() CASCADE;") for link in LINKS]
