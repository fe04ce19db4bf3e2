"""An agent uses only blocks of its own organisation: a row trigger refuses a memory_agentblock row whose agent
and block belong to different organisations, whoever writes it (services, the admin, an import, raw SQL).

A row naming an agent or a block that does not exist (yet) passes here: the foreign keys, checked at commit,
refuse it if it still does not."""

from django.db import migrations

SAME_ORGANIZATION = """
CREATE FUNCTION memory_agentblock_same_organization() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    agent_org text;
    block_org text;
BEGIN
    SELECT organization_id INTO agent_org FROM agents_agent WHERE id = NEW.agent_id;
    SELECT organization_id INTO block_org FROM memory_block WHERE id = NEW.block_id;
    IF agent_org <> block_org THEN
        RAISE EXCEPTION 'block % belongs to another organization than agent %', NEW.block_id, NEW.agent_id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER memory_agentblock_same_organization
    BEFORE INSERT OR UPDATE OF agent_id, block_id ON memory_agentblock
    FOR EACH ROW EXECUTE FUNCTION memory_agentblock_same_organization();
"""
DROP_SAME_ORGANIZATION = "DROP FUNCTION memory_agentblock_same_organization() CASCADE;"


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0001_initial"),
        ("memory", "0003_uncompressed_passage_embedding"),
    ]

    operations = [
        migrations.RunSQL(SAME_ORGANIZATION, DROP_SAME_ORGANIZATION),
    ]
