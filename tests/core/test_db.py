"""apps.core.db: the hand-written SELECTs (fetch_instances) and INSERTs (insert_sql) of hot paths must read
and write what the ORM does."""

from django.db import connection, models
from rest_framework.test import APIClient

from apps.accounts.services import api_key_create
from apps.agents.models import Message
from apps.agents.services import MessageIn, run_create
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
    """insert_sql writes a step's row itself (pre_save and get_db_prep_save per value), and the row read
    back is what Django's own insert stores."""
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


def _djangos_insert(model: type[models.Model], objs: list[models.Model], **query_options: object):
    from django.db.models.sql import InsertQuery
    from django.db.models.sql.compiler import SQLInsertCompiler

    query = InsertQuery(model, **query_options)
    query.insert_values(model._meta.concrete_fields, objs)
    [(sql, params)] = SQLInsertCompiler(query, connection, connection.alias).as_sql()
    for obj in objs:
        obj._state.adding = True
    return sql, list(params)


def _comparable(params: list[object]) -> list[object]:
    """The parameters with the clock's values left out (auto_now) and psycopg's wrappers (bytes, JSON) opened."""
    import datetime

    return ["now" if isinstance(p, datetime.datetime) else p.obj if hasattr(p, "obj") else p for p in params]


def test_rows_with_placeholders_defaults_and_expressions_are_written_as_djangos_compiler_writes_them(org):
    """A step's arrays and bytes (fields with their own placeholders), a message's database default
    (DEFAULT) and the system message's nextval expression: the same SQL and values as Django's compiler,
    which insert_sql no longer runs for them."""
    from django.db.models import Func, Value

    from apps.agents.models import Step
    from apps.agents.system_messages import thread_system_message_upsert
    from apps.core.db import upsert_sql

    agent = AgentFactory(organization=org)
    step = Step(organization=org, run_id="run-x", agent_id=agent.id, tags=["a", "b"], trace=b"\x00\x01")
    messages = [
        MessageFactory.build(organization=org, agent=agent),
        MessageFactory.build(organization=org, agent=agent, sequence_id=-Func(Value("x"), function="f")),
    ]
    for model, objs in ((Step, [step]), (Message, messages)):
        ours = insert_sql(model, objs)
        assert ours[0] == _djangos_insert(model, objs)[0]
        assert _comparable(ours[1]) == _comparable(_djangos_insert(model, objs)[1])
    assert "DEFAULT" in insert_sql(Message, messages[:1])[0]
    assert "::varchar(100)[]" in insert_sql(Step, [step])[0]

    from django.db.models.constants import OnConflict

    update = ["content", "text", "model", "updated_at"]
    ours = upsert_sql(Message, messages[1:], unique_fields=["id"], update_fields=update)
    theirs = _djangos_insert(
        Message,
        messages[1:],
        on_conflict=OnConflict.UPDATE,
        update_fields=[Message._meta.get_field(name) for name in update],
        unique_fields=[Message._meta.get_field("id")],
    )
    assert ours[0] == theirs[0]
    assert _comparable(ours[1]) == _comparable(theirs[1])

    sql, params = thread_system_message_upsert(
        organization_id=org.id, agent_id=agent.id, conversation_id=None, text="You are kind."
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    stored = Message.objects.for_org(org.id).get(agent=agent, role=Message.Role.SYSTEM)
    assert stored.text == "You are kind."
    assert stored.sequence_id < 0


def test_an_expression_django_refuses_in_an_insert_is_refused_with_its_error(org):
    import pytest
    from django.db.models import F

    from apps.agents.models import Step

    with pytest.raises(ValueError, match="F\\(\\) expressions can only be used to update"):
        insert_sql(Step, [Step(organization=org, run_id="run-x", agent_id="agent-x", tags=F("tags"))])


def test_a_memory_turns_wide_statements_are_converted_once_by_psycopg(make_agent, actor, llm, monkeypatch):
    """psycopg parses the placeholders of a statement with more than 50 parameters again at every
    execution unless told otherwise (apps.core.db.cache_wide_statements): a step's inserts have 60-90."""
    from psycopg import _queries

    from apps.agents.loop.runner import execute_run_streamed
    from apps.agents.services import MessageIn, run_create
    from tests.support.scripted_llm import text, tool_call, tool_calls

    agent = make_agent(embedding="")

    def memory_turn(note: str) -> None:
        llm.push(
            tool_calls(tool_call("memory_insert", {"label": "human", "new_string": note})), text("Noted.")
        )
        run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content=f"Remember {note}")])
        result = execute_run_streamed(run.id, agent_id=agent.id)
        assert result is not None
        assert result.stop_reason == "end_turn"

    memory_turn("likes tea")  # the statements' first conversions
    widths: list[int] = []
    parsed: list[bytes] = []
    for name in ("_query2pg_nocache", "_query2pg_client_nocache"):  # server- and client-side binding
        convert = getattr(_queries, name)
        monkeypatch.setattr(
            _queries, name, lambda query, enc, convert=convert: parsed.append(query) or convert(query, enc)
        )

    def width(execute, sql, params, many, context):
        widths.append(len(params or ()))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(width):
        memory_turn("likes green tea")

    assert max(widths) > 50  # the case psycopg leaves out by default
    assert parsed == []


def test_the_statements_every_request_runs_are_prepared_on_its_connection(actor, user, make_agent):
    """With client-side binding (the web process's), an API key's lookup and a send's locked agent and run
    are still prepared on the connection once repeated (prepared_cursor): PostgreSQL parses and plans them
    once, not at every request."""
    agent = make_agent()
    key = api_key_create(actor=actor, user=user, name="prepared").raw_key
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")

    for n in range(3):  # past the connection's prepare_threshold (DATABASE_PREPARE_THRESHOLD, 2)
        assert client.get(f"/v1/agents/{agent.id}").status_code == 200
        run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(f"hello {n}")])
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]

    assert not connection.settings_dict["OPTIONS"].get("server_side_binding")
    assert any("FROM accounts_apikey k JOIN" in statement for statement in prepared)
    assert any("FOR UPDATE OF holder" in statement for statement in prepared)
    assert any('INSERT INTO "agents_run"' in statement for statement in prepared)
