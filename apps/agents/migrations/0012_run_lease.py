"""Run.lease and the function the loop's writes call to prove they hold it (fencing: a partitioned or
handed-back executor that comes back cannot write to a run another executor has claimed since)."""

from django.db import migrations, models

REQUIRE_RUN_LEASE = """
CREATE OR REPLACE FUNCTION agents_require_run_lease(run_id varchar, token varchar) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM agents_run
        WHERE id = run_id AND lease = token AND status IN ('running', 'cancelled')
    ) THEN
        RAISE EXCEPTION 'run % is no longer held by this executor', run_id USING ERRCODE = 'LR001';
    END IF;
    RETURN true;
END
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("agents", "0011_step_logprobs")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="lease",
            field=models.CharField(blank=True, default="", editable=False, max_length=32),
        ),
        migrations.RunSQL(REQUIRE_RUN_LEASE, "DROP FUNCTION IF EXISTS agents_require_run_lease(varchar, varchar);"),
    ]
