"""A folder serves only agents of its own organisation, and an agent holds only files of its own: row triggers
refuse a folders_folder_agents row whose folder and agent belong to different organisations, and a
folders_agentfile row whose agent, file or folder belongs to another organisation than the row, whoever
writes it (services, the admin, raw SQL). The same rule as agents' migration 0009 and memory's 0004.

A row naming a row that does not exist (yet) passes here: the foreign keys, checked at commit, refuse it if it
still does not. Also: chunk embeddings are stored out of line without a compression attempt (floats do not
compress), as memory's 0003 does for passages."""

from django.db import migrations

FOLDER_AGENTS = """
CREATE FUNCTION folders_folder_agents_same_organization() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    folder_org text;
    agent_org text;
BEGIN
    SELECT organization_id INTO folder_org FROM folders_folder WHERE id = NEW.folder_id;
    SELECT organization_id INTO agent_org FROM agents_agent WHERE id = NEW.agent_id;
    IF folder_org <> agent_org THEN
        RAISE EXCEPTION 'agent % belongs to another organization than folder %', NEW.agent_id, NEW.folder_id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER folders_folder_agents_same_organization
    BEFORE INSERT OR UPDATE OF folder_id, agent_id ON folders_folder_agents
    FOR EACH ROW EXECUTE FUNCTION folders_folder_agents_same_organization();
"""

AGENT_FILE = """
CREATE FUNCTION folders_agentfile_same_organization() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    agent_org text;
    file_org text;
    folder_org text;
BEGIN
    SELECT organization_id INTO agent_org FROM agents_agent WHERE id = NEW.agent_id;
    SELECT organization_id INTO file_org FROM folders_filemetadata WHERE id = NEW.file_id;
    SELECT organization_id INTO folder_org FROM folders_folder WHERE id = NEW.folder_id;
    IF agent_org <> NEW.organization_id OR file_org <> NEW.organization_id
            OR folder_org <> NEW.organization_id THEN
        RAISE EXCEPTION 'file % and agent % belong to different organizations', NEW.file_id, NEW.agent_id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER folders_agentfile_same_organization
    BEFORE INSERT OR UPDATE OF agent_id, file_id, folder_id, organization_id ON folders_agentfile
    FOR EACH ROW EXECUTE FUNCTION folders_agentfile_same_organization();
"""


class Migration(migrations.Migration):
    dependencies = [("folders", "0001_initial")]

    operations = [
        migrations.RunSQL(FOLDER_AGENTS, "DROP FUNCTION folders_folder_agents_same_organization() CASCADE;"),
        migrations.RunSQL(AGENT_FILE, "DROP FUNCTION folders_agentfile_same_organization() CASCADE;"),
        migrations.RunSQL(
            "ALTER TABLE folders_filechunk ALTER COLUMN embedding SET STORAGE EXTERNAL;",
            "ALTER TABLE folders_filechunk ALTER COLUMN embedding SET STORAGE EXTENDED;",
        ),
    ]
