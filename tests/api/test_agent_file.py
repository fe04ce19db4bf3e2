import copy
import json
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from apps.agents.models import Agent, AgentSecret, Message
from apps.agents.services import BlockSpec, MessageIn, agent_create, agent_send_message
from apps.core.actor import Actor
from apps.sandbox.models import SandboxConfig, SandboxEnvironmentVariable
from apps.tools.models import Tool
from apps.tools.services import tool_upsert
from tests.factories import ProviderFactory
from tests.support.scripted_llm import text, tool_call, tool_calls

ADD_SOURCE = '''
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a (int): The first number.
        b (int): The second number.
    """
    return a + b
'''
SECRET_VALUE = "s3cr3t-agent-token"
SANDBOX_VALUE = "s3cr3t-sandbox-value"


@pytest.fixture
def agent(actor: Actor, llm) -> Agent:
    """An agent with blocks, base and custom tools, rules and secrets, that has taken one turn with a tool."""
    tool = tool_upsert(actor=actor, source_code=ADD_SOURCE)
    ProviderFactory(organization_id=actor.organization_id, name="byok", api_key="sk-byok-secret-value")
    config = SandboxConfig.objects.for_actor(actor).create(sandbox_type=SandboxConfig.Type.LOCAL)
    SandboxEnvironmentVariable.objects.for_actor(actor).create(
        sandbox_config=config, key="K", value=SANDBOX_VALUE
    )
    agent = agent_create(
        actor=actor,
        name="Calculator",
        system="You add numbers.",
        model="openai/gpt-4o-mini",
        embedding="openai/text-embedding-3-small",
        memory_blocks=[
            BlockSpec(label="persona", value="I add.", limit=2000),
            BlockSpec(label="human", value="Name: Sam", limit=2000, description="About Sam"),
        ],
        tool_ids=[tool.id],
        tool_rules=[{"type": "max_count_per_step", "tool_name": "add", "max_count_limit": 3}],
        tags=["math"],
        secrets_={"API_TOKEN": SECRET_VALUE},
    )
    llm.push(tool_calls(tool_call("add", {"a": 2, "b": 3}, id="call_1")), text("It is 5.", reasoning="Easy."))
    result = agent_send_message(actor=actor, agent_id=agent.id, messages=[MessageIn(content="2 + 3?")])
    assert result.stop_reason == "end_turn"
    agent.refresh_from_db()
    return agent


def export(client: APIClient, agent_id: str, **query: Any) -> dict[str, Any]:
    response = client.get(f"/v1/agents/{agent_id}/export", query)
    assert response.status_code == 200, response.content
    return json.loads(response.content)


def import_file(client: APIClient, content: bytes | str, **fields: str) -> Any:
    raw = content.encode() if isinstance(content, str) else content
    upload = SimpleUploadedFile("agent.af", raw, content_type="application/json")
    return client.post("/v1/agents/import", {"file": upload, **fields}, format="multipart")


def without_volatile(document: dict[str, Any]) -> dict[str, Any]:
    """The file without its time of export and its agents' system messages' text and time: each agent's
    is compiled for it (it names the agent's own id)."""
    clean = copy.deepcopy(document)
    clean.pop("created_at")
    for agent in clean["agents"]:
        for message in agent["messages"]:
            if message["role"] == "system":
                message.pop("content")
                message.pop("created_at")
    return clean


# --- export ------------------------------------------------------------------------------------------


def test_export_is_indented_json_text(actor, agent, api_client_for):
    response = api_client_for(actor).get(f"/v1/agents/{agent.id}/export")

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response.content.decode().startswith('{\n  "agents": [')


def test_export_uses_file_local_ids_and_letta_shapes(actor, agent, api_client_for):
    document = export(api_client_for(actor), agent.id)

    [exported] = document["agents"]
    assert exported["id"] == "agent-0"
    assert (exported["name"], exported["system"], exported["tags"]) == (
        "Calculator",
        "You add numbers.",
        ["math"],
    )
    assert [b["id"] for b in document["blocks"]] == ["block-0", "block-1"]
    assert [b["label"] for b in document["blocks"]] == ["human", "persona"]
    assert document["blocks"][0]["description"] == "About Sam"
    assert exported["block_ids"] == ["block-0", "block-1"]
    names = [t["name"] for t in document["tools"]]
    assert names == ["add", "conversation_search", "memory_insert", "memory_replace"]
    assert exported["tool_ids"] == ["tool-0", "tool-1", "tool-2", "tool-3"]
    assert document["tools"][0]["source_code"] == ADD_SOURCE
    assert document["tools"][0]["json_schema"]["name"] == "add"
    assert exported["tool_rules"] == [
        {"type": "max_count_per_step", "tool_name": "add", "max_count_limit": 3}
    ]
    assert exported["llm_config"]["handle"] == "openai/gpt-4o-mini"
    assert exported["llm_config"]["model_endpoint_type"] == "openai"
    assert exported["embedding_config"]["handle"] == "openai/text-embedding-3-small"
    assert exported["embedding_config"]["embedding_dim"] == 1536
    assert (exported["include_base_tools"], exported["memory_blocks"], exported["tools"]) == (False, [], [])
    assert document["metadata"] == {"revision_id": "letta-django-1"}


def test_export_carries_the_in_context_messages_in_letta_message_schema(actor, agent, api_client_for):
    [exported] = export(api_client_for(actor), agent.id)["agents"]

    system, *messages = exported["messages"]
    assert exported["in_context_message_ids"] == [f"message-{i}" for i in range(5)]
    assert [system["id"], *(m["id"] for m in messages)] == exported["in_context_message_ids"]
    assert [system["role"], *(m["role"] for m in messages)] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert system["content"][0]["text"].startswith("You add numbers.")
    assert messages[0]["content"] == [{"type": "text", "text": "2 + 3?"}]
    assert messages[1]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    ]
    assert messages[2]["tool_call_id"] == "call_1"
    assert messages[2]["tool_returns"] == [
        {"tool_call_id": "call_1", "status": "success", "stdout": None, "stderr": None, "func_response": "5"}
    ]
    assert messages[3]["content"] == [
        {"is_native": False, "type": "reasoning", "reasoning": "Easy."},
        {"type": "text", "text": "It is 5."},
    ]
    assert {m["agent_id"] for m in [system, *messages]} == {"agent-0"}


def test_export_never_contains_secret_values_or_credentials(actor, agent, api_client_for, settings):
    content = api_client_for(actor).get(f"/v1/agents/{agent.id}/export").content.decode()

    [exported] = json.loads(content)["agents"]
    assert exported["secrets"] == {"API_TOKEN": ""}
    assert exported["tool_exec_environment_variables"] == {"API_TOKEN": ""}
    for secret in (SECRET_VALUE, SANDBOX_VALUE, "sk-byok-secret-value", settings.OPENAI_BASE_URL):
        assert secret not in content
    assert f'"{settings.OPENAI_API_KEY}"' not in content


def test_export_can_scrub_messages(actor, agent, api_client_for):
    [exported] = export(api_client_for(actor), agent.id, scrub_messages="true")["agents"]

    assert (exported["messages"], exported["in_context_message_ids"]) == ([], [])


def test_export_in_the_legacy_format_is_400(actor, agent, api_client_for):
    response = api_client_for(actor).get(f"/v1/agents/{agent.id}/export", {"use_legacy_format": "true"})

    assert response.status_code == 400
    assert response.json()["detail"] == "Legacy format is not supported"


def test_export_of_an_unknown_agent_is_404(actor, api_client_for):
    response = api_client_for(actor).get("/v1/agents/agent-00000000-0000-4000-8000-000000000000/export")

    assert response.status_code == 404
    assert response.json()["detail"] == "Agent with id 'agent-00000000-0000-4000-8000-000000000000' not found"


# --- import ------------------------------------------------------------------------------------------


def test_round_trip_gives_the_same_file_modulo_ids(actor, agent, api_client_for):
    client = api_client_for(actor)
    first = export(client, agent.id)

    response = import_file(client, json.dumps(first), append_copy_suffix="false")
    [new_id] = response.json()["agent_ids"]
    second = export(client, new_id)

    assert response.status_code == 200
    assert new_id != agent.id
    assert without_volatile(second) == without_volatile(first)


def test_import_recreates_a_working_agent(actor, agent, api_client_for, llm):
    client = api_client_for(actor)
    response = import_file(client, json.dumps(export(client, agent.id)))
    [new_id] = response.json()["agent_ids"]
    imported = Agent.objects.for_actor(actor).get(id=new_id)

    llm.push(text("Still 5."))
    result = agent_send_message(actor=actor, agent_id=new_id, messages=[MessageIn(content="And again?")])

    assert imported.name == "Calculator_copy"
    assert (imported.model, imported.embedding, imported.system) == (
        "openai/gpt-4o-mini",
        "openai/text-embedding-3-small",
        "You add numbers.",
    )
    assert sorted(b.label for b in imported.blocks.all()) == ["human", "persona"]
    assert not set(imported.blocks.values_list("id", flat=True)) & set(
        agent.blocks.values_list("id", flat=True)
    )
    assert set(imported.tools.values_list("id", flat=True)) == set(agent.tools.values_list("id", flat=True))
    assert imported.tool_rules == agent.tool_rules
    assert len(imported.message_ids) == 4
    assert not set(imported.message_ids) & set(agent.message_ids)
    assert result.stop_reason == "end_turn"
    sent = [m.get("content") for m in llm.last_chat_request()["messages"]]
    assert "2 + 3?" in sent
    assert "It is 5." in sent
    assert any("Name: Sam" in (c or "") for c in sent)


def test_import_fills_secrets_from_the_form(actor, agent, api_client_for):
    client = api_client_for(actor)

    response = import_file(client, json.dumps(export(client, agent.id)), secrets='{"API_TOKEN": "new-value"}')

    [new_id] = response.json()["agent_ids"]
    assert dict(AgentSecret.objects.for_actor(actor).filter(agent_id=new_id).values_list("key", "value")) == {
        "API_TOKEN": "new-value"
    }


def test_import_can_strip_messages_and_rename(actor, agent, api_client_for):
    client = api_client_for(actor)

    response = import_file(client, json.dumps(export(client, agent.id)), strip_messages="true", name="Fresh")

    imported = Agent.objects.for_actor(actor).get(id=response.json()["agent_ids"][0])
    assert (imported.name, imported.message_ids) == ("Fresh", [])
    assert list(Message.objects.for_actor(actor).filter(agent=imported).values_list("role", flat=True)) == [
        "system"  # its own, compiled when it was created
    ]


def test_import_accepts_double_encoded_json(actor, agent, api_client_for):
    client = api_client_for(actor)

    response = import_file(client, json.dumps(json.dumps(export(client, agent.id))))

    assert response.status_code == 200
    assert len(response.json()["agent_ids"]) == 1


@pytest.mark.parametrize("override", ["true", "false"])
def test_existing_tools_are_overwritten_only_when_asked(actor, agent, api_client_for, override):
    client = api_client_for(actor)
    document = export(client, agent.id)
    document["tools"][0]["source_code"] = ADD_SOURCE.replace("a + b", "b + a")

    import_file(client, json.dumps(document), override_existing_tools=override)

    source = Tool.objects.for_actor(actor).get(name="add").source_code
    assert source.endswith("return b + a\n") is (override == "true")


def test_import_into_another_organisation_creates_its_own_rows(actor, other_org_actor, agent, api_client_for):
    document = export(api_client_for(actor), agent.id)

    response = import_file(api_client_for(other_org_actor), json.dumps(document))

    [new_id] = response.json()["agent_ids"]
    imported = Agent.objects.for_actor(other_org_actor).get(id=new_id)
    tool_orgs = set(imported.tools.values_list("organization_id", flat=True))
    assert tool_orgs == {other_org_actor.organization_id}
    assert Tool.objects.for_actor(other_org_actor).get(name="add").source_code == ADD_SOURCE
    assert Agent.objects.for_actor(actor).count() == 1


def letta_file() -> dict[str, Any]:
    """A file as Letta writes it: a system-prompt message first, func_response returns, Letta-only tools."""
    return {
        "agents": [
            {
                "id": "agent-0",
                "name": "letta agent",
                "agent_type": "letta_v1_agent",
                "system": "You are Letta.",
                "tool_ids": ["tool-0", "tool-1"],
                "block_ids": ["block-0"],
                "tool_rules": [
                    {"type": "requires_approval", "tool_name": "memory_insert", "prompt_template": None}
                ],
                "include_base_tools": False,
                "llm_config": {
                    "model": "gpt-4o-mini",
                    "model_endpoint_type": "openai",
                    "model_endpoint": "https://api.openai.com/v1",
                    "context_window": 128000,
                    "handle": "openai/gpt-4o-mini",
                    "temperature": 0.5,
                },
                "embedding_config": {
                    "embedding_model": "text-embedding-3-small",
                    "embedding_endpoint_type": "openai",
                    "embedding_dim": 1536,
                },
                "secrets": {"TOKEN": ""},
                "in_context_message_ids": ["message-0", "message-1", "message-2"],
                "messages": [
                    {
                        "id": "message-0",
                        "role": "system",
                        "content": [{"type": "text", "text": "You are Letta."}],
                    },
                    {
                        "id": "message-1",
                        "role": "user",
                        "content": "hi",
                        "created_at": "2025-01-01T10:00:00Z",
                    },
                    {
                        "id": "message-2",
                        "role": "assistant",
                        "content": [
                            {"type": "reasoning", "reasoning": "greet", "is_native": True},
                            {"type": "text", "text": "Hello!"},
                        ],
                        "created_at": "2025-01-01T10:00:01Z",
                    },
                ],
                "files_agents": [],
                "group_ids": [],
            }
        ],
        "groups": [],
        "blocks": [
            {"id": "block-0", "label": "persona", "value": "I am Letta", "limit": 5000, "metadata": {}}
        ],
        "files": [],
        "sources": [],
        "tools": [
            {
                "id": "tool-0",
                "name": "memory_insert",
                "tool_type": "letta_sleeptime_core",
                "source_code": "x",
            },
            {
                "id": "tool-1",
                "name": "web_search",
                "tool_type": "letta_builtin",
                "source_code": "def web_search(): pass",
            },
        ],
        "mcp_servers": [],
        "metadata": {"revision_id": "5b804970e6a0"},
    }


def test_a_letta_written_file_imports(actor, api_client_for):
    response = import_file(api_client_for(actor), json.dumps(letta_file()))

    assert response.status_code == 200
    imported = Agent.objects.for_actor(actor).get(id=response.json()["agent_ids"][0])
    assert imported.name == "letta agent_copy"
    assert (imported.model, imported.embedding) == ("openai/gpt-4o-mini", "openai/text-embedding-3-small")
    assert (imported.context_window_limit, imported.temperature) == (128000, 0.5)
    # Every Letta base tool's name resolves here, built yet or not (web_search answers that it is not).
    assert sorted(t.name for t in imported.tools.all()) == ["memory_insert", "web_search"]
    assert imported.tools.get(name="memory_insert").tool_type == "letta_sleeptime_core"
    assert imported.tool_rules == [{"type": "requires_approval", "tool_name": "memory_insert"}]
    messages = [Message.objects.for_actor(actor).get(id=i) for i in imported.message_ids]
    assert [(m.role, m.text) for m in messages] == [("user", "hi"), ("assistant", "Hello!")]
    assert messages[0].created_at.isoformat() == "2025-01-01T10:00:00+00:00"
    assert dict(AgentSecret.objects.for_actor(actor).filter(agent=imported).values_list("key", "value")) == {
        "TOKEN": ""
    }


@pytest.mark.parametrize(
    ("content", "detail"),
    [
        ("{not json", "Corrupted agent file format."),
        (
            json.dumps({"name": "old", "tools": []}),
            "Legacy AgentSchema format is deprecated. Please use the new AgentFileSchema format with 'agents' field.",
        ),
        (json.dumps({"agents": [{"name": "no id"}]}), "Invalid agent file: agents.0.id: Field required"),
        (
            json.dumps({"agents": [{"id": "agent-0", "block_ids": ["block-9"]}]}),
            "Invalid agent file: agent agent-0 references unknown block block-9",
        ),
        (
            json.dumps({"agents": [{"id": "agent-0", "in_context_message_ids": ["message-3"]}]}),
            "Invalid agent file: agent agent-0 has in-context message message-3 that is not in its messages",
        ),
    ],
)
def test_bad_files_are_400_and_create_nothing(actor, api_client_for, content, detail):
    response = import_file(api_client_for(actor), content)

    assert response.status_code == 400
    assert response.json()["detail"] == detail
    assert not Agent.objects.for_actor(actor).exists()


def test_a_failing_import_leaves_nothing_behind(actor, api_client_for):
    document = letta_file()
    document["agents"][0]["agent_type"] = "nonsense_agent"

    response = import_file(api_client_for(actor), json.dumps(document))

    assert response.status_code == 400
    assert not Agent.objects.for_actor(actor).exists()
    assert not Tool.objects.for_actor(actor).exists()


def test_import_without_a_file_is_422(actor, api_client_for):
    response = api_client_for(actor).post("/v1/agents/import", {"name": "x"}, format="multipart")

    assert response.status_code == 422
    assert "file" in response.json()["detail"]


def test_secrets_that_are_not_a_json_object_are_400(actor, api_client_for):
    response = import_file(api_client_for(actor), json.dumps(letta_file()), secrets="[1]")

    assert response.status_code == 400
    assert not Agent.objects.for_actor(actor).exists()


# --- tenancy and authentication ----------------------------------------------------------------------


def test_another_organisation_cannot_export_an_agent(actor, other_org_actor, agent, api_client_for):
    response = api_client_for(other_org_actor).get(f"/v1/agents/{agent.id}/export")

    assert response.status_code == 404
    assert response.json()["detail"] == f"Agent with id '{agent.id}' not found"


@pytest.mark.parametrize(
    ("method", "path"), [("get", "/v1/agents/agent-1/export"), ("post", "/v1/agents/import")]
)
@pytest.mark.django_db
def test_requests_without_a_key_are_401(method, path):
    response = getattr(APIClient(), method)(path)

    assert response.status_code == 401
    assert not Agent.objects.unscoped().exists()
