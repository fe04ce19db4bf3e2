"""apps.core.db.fetch_instances: hand-written SELECTs on hot paths must build what the ORM builds."""

from django.db import connection, models

from apps.agents.models import Message
from apps.core.db import fetch_instances, insert_sql
from apps.llm.models import Provider
from tests.factories import AgentFactory, MessageFactory, ProviderFactory


def field_values(instance: models.Model) -> dict[str, object]:
    return {
        field.attname: getattr(instance, field.attname)
        for field in instance._meta.concrete_fields
        if field.attname not in instance.get_deferred_fields()
    }


def test_rows_convert_as_the_orm_converts_them(org):
    provider = ProviderFactory(organization=org, api_key="sk-live-secret")
    message = MessageFactory(
        organization=org,
        tool_calls=[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    )

    [read_provider] = fetch_instances(
        Provider, "SELECT {columns} FROM llm_provider AS p WHERE p.id = %s", [provider.id], alias="p"
    )
    [read_message] = fetch_instances(
        Message,
        "SELECT {columns} FROM agents_message AS m WHERE m.id = %s",
        [message.id],
        alias="m",
        exclude=frozenset({"embedding"}),
    )

    assert read_provider.api_key == "sk-live-secret"  # decrypted
    assert field_values(read_provider) == field_values(Provider.objects.for_org(org.id).get(id=provider.id))
    assert read_message.tool_calls[0]["function"]["name"] == "f"  # JSON parsed
    assert read_message.get_deferred_fields() == {"embedding"}
    orm_message = Message.objects.for_org(org.id).defer("embedding").get(id=message.id)
    assert field_values(read_message) == field_values(orm_message)
    assert not read_message._state.adding  # a stored row: save() updates it


INCOMPRESSIBLE = [
    ("agents_agent", "message_ids"),
    ("agents_conversation", "message_ids"),
    ("agents_step", "trace"),
    ("agents_message", "embedding"),
    ("memory_passage", "embedding"),
]


def test_ids_traces_and_embeddings_are_stored_without_a_compression_attempt(db):
    """Random ids, zlib bytes and floats do not compress: pglz's attempt made every in-context append
    cost ~3x more (agents 0006, 0007, memory 0003)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attrelid::regclass::text, attname, attstorage FROM pg_attribute "
            "WHERE (attrelid::regclass::text, attname) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
            [[table for table, _ in INCOMPRESSIBLE], [column for _, column in INCOMPRESSIBLE]],
        )
        storage = {(table, column): mode for table, column, mode in cursor.fetchall()}

    assert storage == dict.fromkeys(INCOMPRESSIBLE, "e")  # EXTERNAL


def _stored_content(org, count: int) -> tuple[str, list[object]]:
    from apps.core.db import insert_all

    tricky = [{"type": "text", "text": 'quote " backslash \\ newline \n unicode é \u2603'}]
    agent = AgentFactory(organization=org)
    rows = [
        MessageFactory.build(organization=org, agent=agent, content=tricky, name=f"m{i:05}")
        for i in range(count)
    ]
    statement = insert_sql(Message, rows)[0]
    insert_all((Message, rows))
    stored = Message.objects.for_org(org.id).filter(id__in=[r.id for r in rows]).order_by("name")
    return statement, [m.content for m in stored]


def test_a_turns_rows_are_inserted_as_values_and_read_back_unchanged(org):
    statement, contents = _stored_content(org, 3)
    assert " VALUES (" in statement
    assert contents == [[{"type": "text", "text": 'quote " backslash \\ newline \n unicode é \u2603'}]] * 3


def test_plain_rows_take_the_short_path_and_store_what_djangos_would(org):
    """Steps have no database default: insert_sql writes them itself (pre_save and get_db_prep_save per
    value), and the row read back is what Django's own insert stores."""
    from apps.agents.models import Run, Step
    from apps.core.db import insert_all

    agent = AgentFactory(organization=org)
    run = Run.all_objects.create(organization=org, agent=agent)
    ours = Step(
        organization=org, run=run, agent_id=run.agent_id, stop_reason='quote " \\ end', total_tokens=7
    )
    theirs = Step(
        organization=org, run=run, agent_id=run.agent_id, stop_reason='quote " \\ end', total_tokens=7
    )
    statement, _ = insert_sql(Step, [ours])
    insert_all((Step, [ours]))
    Step.all_objects.bulk_create([theirs])

    assert statement.startswith('INSERT INTO "agents_step" (')
    stored = {s.id: s for s in Step.all_objects.filter(id__in=[ours.id, theirs.id])}
    skip = {"id", "created_at", "updated_at"}
    assert {k: v for k, v in field_values(stored[ours.id]).items() if k not in skip} == {
        k: v for k, v in field_values(stored[theirs.id]).items() if k not in skip
    }
