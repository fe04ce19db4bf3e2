"""A step's provider trace (the exact LLM request and response) moves from two JSON columns to one
zlib-compressed column: it holds the step's whole context, so it was the largest write of a step and
grew the table by the context's size at every step. Existing traces are converted, then the JSON
columns are dropped (reversible: converted back)."""

import json
import zlib

from django.db import migrations, models

BATCH = 500


def pack(request, response):
    # apps.agents.models.pack_trace as of this migration (a migration must not change with the app).
    document = json.dumps({"request": request, "response": response}, separators=(",", ":"), default=str)
    return zlib.compress(document.encode(), 1)


def compress_traces(apps, schema_editor):
    Step = apps.get_model("agents", "Step")
    pending = Step._default_manager.filter(models.Q(request_json__isnull=False) | models.Q(response_json__isnull=False))
    batch = []
    for step in pending.only("id", "request_json", "response_json").iterator(chunk_size=BATCH):
        step.trace = pack(step.request_json, step.response_json)
        batch.append(step)
        if len(batch) >= BATCH:
            Step._default_manager.bulk_update(batch, ["trace"])
            batch = []
    if batch:
        Step._default_manager.bulk_update(batch, ["trace"])


def expand_traces(apps, schema_editor):
    Step = apps.get_model("agents", "Step")
    batch = []
    for step in Step._default_manager.filter(trace__isnull=False).only("id", "trace").iterator(chunk_size=BATCH):
        document = json.loads(zlib.decompress(step.trace))
        step.request_json, step.response_json = document.get("request"), document.get("response")
        batch.append(step)
        if len(batch) >= BATCH:
            Step._default_manager.bulk_update(batch, ["request_json", "response_json"])
            batch = []
    if batch:
        Step._default_manager.bulk_update(batch, ["request_json", "response_json"])


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0003_message_embedding"),
    ]

    operations = [
        migrations.AddField(
            model_name="step",
            name="trace",
            field=models.BinaryField(
                blank=True,
                help_text="The exact request sent to the LLM and its response (pack_trace): zlib-compressed JSON.",
                null=True,
            ),
        ),
        migrations.RunPython(compress_traces, expand_traces),
        migrations.RemoveField(model_name="step", name="request_json"),
        migrations.RemoveField(model_name="step", name="response_json"),
    ]
