"""Archives record who created them: the role matrix lets their creator (besides owners and admins) change,
delete, attach and detach them and write their passages. Existing archives are left without a creator
(owners and admins only), except an agent's archive, which becomes its agent's creator's."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# The first agent attached (the lowest link id) is the one whose first insert created the archive.
FILL = """
UPDATE memory_archive AS archive SET created_by_id = agent.created_by_id
FROM (
    SELECT DISTINCT ON (link.archive_id) link.archive_id, a.created_by_id
    FROM agents_agent_archives AS link JOIN agents_agent AS a ON a.id = link.agent_id
    ORDER BY link.archive_id, link.id
) AS agent
WHERE archive.id = agent.archive_id AND archive.created_by_id IS NULL;
"""


class Migration(migrations.Migration):
    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("agents", "0002_initial"),
        ("memory", "0004_agentblock_same_organization"),
    ]

    operations = [
        migrations.AddField(
            model_name="archive",
            name="created_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.RunSQL(FILL, migrations.RunSQL.noop),
    ]
