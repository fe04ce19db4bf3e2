"""The workspace's memory column: context window viewer, core memory blocks (edit, conflicts, history,
restore), archival and recall memory, all scoped to the signed-in user's organisation."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client

from apps.accounts.models import User
from apps.agents.models import Agent
from apps.agents.selectors import agent_context_overview
from apps.agents.services import (
    BlockSpec,
    MessageIn,
    agent_create,
    agent_send_message,
    conversation_create,
    run_create,
)
from apps.core.actor import Actor
from apps.llm.handles import DEFAULT_CONTEXT_WINDOW
from apps.memory import archival
from apps.memory.models import Block
from apps.memory.selectors import block_history
from apps.memory.services import Editor, block_update
from tests.support.scripted_llm import ScriptedLLM


def _make_agent(actor: Actor, name: str = "Helper", **kwargs: Any) -> Agent:
    kwargs.setdefault(
        "memory_blocks",
        [
            BlockSpec(label="human", value="Name: unknown", limit=2000, description="About the user"),
            BlockSpec(label="persona", value="I am a helpful assistant.", limit=2000, read_only=True),
        ],
    )
    return agent_create(
        actor=actor,
        name=name,
        model="openai/gpt-4o-mini",
        embedding="openai/text-embedding-3-small",
        **kwargs,
    )


@pytest.fixture
def agent(actor: Actor, llm: ScriptedLLM) -> Agent:
    return _make_agent(actor)


@pytest.fixture
def signed_in(client: Client, user: User) -> Client:
    client.force_login(user)
    return client


def _block(agent: Agent, label: str) -> Block:
    return Block.all_objects.get(agent_attachments__agent=agent, label=label)


def _save(client: Client, agent: Agent, block: Block, value: str, version: int | None = None) -> Any:
    return client.post(
        f"/agents/{agent.id}/memory/blocks/{block.id}/",
        {"value": value, "version": block.version if version is None else version},
        HTTP_HX_REQUEST="true",
    )


def _tokens(html: str) -> dict[str, int]:
    return {
        key: int(value) for key, value in re.findall(r'data-testid="ctx-(\w+)" data-tokens="(\d+)"', html)
    }


def _total(html: str) -> tuple[int, int]:
    match = re.search(r'data-testid="context-total"[^>]*>\s*([\d,]+) / ([\d,]+) tokens', html)
    assert match, html
    return int(match.group(1).replace(",", "")), int(match.group(2).replace(",", ""))


# --- the column on the workspace page ---------------------------------------------------------------------


def test_workspace_shows_each_block_with_its_count_limit_and_read_only_state(
    signed_in: Client, agent: Agent
) -> None:
    response = signed_in.get(f"/agents/{agent.id}/")

    html = response.content.decode()
    assert response.status_code == 200
    human = html[html.index('data-testid="block-human"') : html.index('data-testid="block-persona"')]
    assert "About the user" in human
    assert re.search(r"<span data-count>13</span> / 2000", human)
    assert "Name: unknown</textarea>" in human
    persona = html[html.index('data-testid="block-persona"') :]
    assert "read-only for the agent" in persona
    assert re.search(r"<span data-count>25</span> / 2000", persona)
    assert 'data-testid="context-window"' in html


# --- editing blocks ---------------------------------------------------------------------------------------


def test_saving_a_block_writes_a_new_version_recorded_as_the_users_edit(
    signed_in: Client, agent: Agent, user: User
) -> None:
    block = _block(agent, "human")

    response = _save(signed_in, agent, block, "Name: Ada\r\nLikes tea")

    block.refresh_from_db()
    assert response.status_code == 200
    assert json.loads(response["HX-Trigger"]) == {"ade:agent-changed": {}}
    assert "Saved · version 2" in response.content.decode()
    assert block.value == "Name: Ada\nLikes tea"
    assert block.version == 2
    latest = block_history(actor=Actor.system(agent.organization_id), block_id=block.id).first()
    assert (latest.actor_type, latest.actor_id, latest.value_before) == ("user", user.id, "Name: unknown")


def test_a_block_changed_meanwhile_is_not_overwritten_and_its_current_value_is_shown(
    signed_in: Client, agent: Agent, actor: Actor
) -> None:
    block = _block(agent, "human")
    block_update(
        actor=actor, block_id=block.id, value="Name: Grace (from the agent)", editor=Editor.agent(agent.id)
    )

    response = _save(signed_in, agent, block, "Name: Ada", version=1)

    html = response.content.decode()
    block.refresh_from_db()
    assert response.status_code == 409
    assert "Not saved: this block changed while you were editing" in html
    assert "you started from version 1, it is now version 2" in html
    assert "Name: Grace (from the agent)</textarea>" in html  # the editor shows the current value
    assert "Name: Ada</textarea>" in html  # the user's text is kept, read-only, to copy back
    assert block.value == "Name: Grace (from the agent)"
    assert "HX-Trigger" not in response


def test_a_value_over_the_limit_is_refused_with_a_clear_message_and_kept_in_the_editor(
    signed_in: Client, agent: Agent
) -> None:
    block = _block(agent, "human")

    response = _save(signed_in, agent, block, "x" * 2001)

    html = response.content.decode()
    block.refresh_from_db()
    assert response.status_code == 422
    assert "Block &#x27;human&#x27; value is 2001 characters, over its limit of 2000" in html
    assert "x" * 2001 + "</textarea>" in html
    assert 'class="mem-count over"' in html
    assert block.value == "Name: unknown"
    assert block.version == 1


def test_history_shows_who_changed_what_as_a_diff_and_restore_brings_a_version_back(
    signed_in: Client, agent: Agent, actor: Actor
) -> None:
    block = _block(agent, "human")
    _save(signed_in, agent, block, "Name: Ada\nLikes tea")
    block_update(
        actor=actor, block_id=block.id, value="Name: Ada\nLikes green tea", editor=Editor.agent(agent.id)
    )

    history = signed_in.get(f"/agents/{agent.id}/memory/blocks/{block.id}/history/").content.decode()

    assert "Agent Helper" in history
    assert "just now" in history
    assert "User alice" in history
    assert '<span class="d-del">- Likes tea</span>' in history
    assert '<span class="d-add">+ Likes green tea</span>' in history
    assert '<span class="d-del">- Name: unknown</span>' in history
    assert '<span class="d-add">+ Name: Ada</span>' in history
    first = block_history(actor=actor, block_id=block.id).get(version=1)

    response = signed_in.post(
        f"/agents/{agent.id}/memory/blocks/{block.id}/history/{first.id}/restore/", HTTP_HX_REQUEST="true"
    )

    block.refresh_from_db()
    assert response.status_code == 200
    assert json.loads(response["HX-Trigger"]) == {"ade:agent-changed": {}}
    assert block.value == "Name: unknown"
    assert block.version == 4
    assert "Name: unknown</textarea>" in response.content.decode()
    assert 'data-testid="block-history"' in response.content.decode()  # the history stays open


# --- the context window viewer ----------------------------------------------------------------------------


def test_context_sections_add_up_to_the_total_and_grow_after_a_block_edit(
    signed_in: Client, agent: Agent
) -> None:
    before = signed_in.get(f"/agents/{agent.id}/memory/context/").content.decode()
    tokens = _tokens(before)
    total, window = _total(before)
    assert set(tokens) == {
        "system_prompt",
        "memory_blocks",
        "tool_rules",
        "metadata",
        "summary",
        "tool_schemas",
        "messages",
    }
    assert sum(tokens.values()) == total
    assert window == DEFAULT_CONTEXT_WINDOW  # gpt-4o-mini's 128k, capped at the deployment default
    assert tokens["system_prompt"] > 0
    assert tokens["memory_blocks"] > 0
    assert tokens["tool_schemas"] > 0

    _save(
        signed_in,
        agent,
        _block(agent, "human"),
        "Name: Ada. " + "She loves long walks in the mountains. " * 20,
    )

    after = _tokens(signed_in.get(f"/agents/{agent.id}/memory/context/").content.decode())
    assert after["memory_blocks"] > tokens["memory_blocks"] + 100
    assert after["system_prompt"] == tokens["system_prompt"]


def test_the_overview_is_what_the_next_llm_request_contains(
    actor: Actor, agent: Agent, llm: ScriptedLLM
) -> None:
    overview = agent_context_overview(actor=actor, agent_id=agent.id)
    llm.push(llm.text("Hello!"))

    agent_send_message(actor=actor, agent_id=agent.id, messages=[MessageIn(content="hi")])

    request = llm.last_chat_request()
    assert request["messages"][0] == {"role": "system", "content": overview.system_message}
    assert sorted(tool["function"]["name"] for tool in request["tools"]) == sorted(overview.tool_names)


def test_the_context_viewer_says_why_when_the_model_cannot_be_resolved(
    signed_in: Client, actor: Actor, settings
) -> None:
    settings.OPENAI_API_KEY = ""
    settings.OPENAI_BASE_URL = ""
    agent = _make_agent(actor, name="NoProvider")

    response = signed_in.get(f"/agents/{agent.id}/memory/context/")

    assert response.status_code == 200
    assert 'data-testid="context-error"' in response.content.decode()
    assert "openai/gpt-4o-mini" in response.content.decode()


# --- archival memory --------------------------------------------------------------------------------------


def test_adding_searching_filtering_and_deleting_passages(
    signed_in: Client, agent: Agent, actor: Actor
) -> None:
    url = f"/agents/{agent.id}/memory/archival/"

    added = signed_in.post(
        url, {"text": "Ada's cat is called Pixel", "tags": "pets, family"}, HTTP_HX_REQUEST="true"
    )
    signed_in.post(
        url, {"text": "The quarterly report is due in March", "tags": "work"}, HTTP_HX_REQUEST="true"
    )

    assert added.status_code == 200
    assert json.loads(added["HX-Trigger"]) == {"ade:agent-changed": {}}
    assert "Passage saved to archival memory." in added.content.decode()
    archive_ids = [a.id for a in archival.agent_archives(actor=actor, agent_id=agent.id)]
    passages = {p.text: p for p in archival.passage_list(actor=actor, archive_ids=archive_ids)}
    assert passages["Ada's cat is called Pixel"].tags == ["pets", "family"]

    found = signed_in.get(url, {"q": "cat", "part": "results"}).content.decode()
    assert found.index("Pixel") < found.index("quarterly")
    assert "% match" in found

    tagged = signed_in.get(url, {"tag": "work", "part": "results"}).content.decode()
    assert "quarterly report" in tagged
    assert "Pixel" not in tagged
    assert "1 passage tagged" in tagged

    cat = passages["Ada's cat is called Pixel"]
    deleted = signed_in.post(f"{url}{cat.id}/delete/", {"q": "", "tag": ""}, HTTP_HX_REQUEST="true")

    assert deleted.status_code == 200
    assert "Passage deleted." in deleted.content.decode()
    assert "Pixel" not in deleted.content.decode()
    assert archival.archival_count(actor=actor, archive_ids=archive_ids) == 1


def test_an_empty_passage_is_refused_with_a_message(signed_in: Client, agent: Agent) -> None:
    response = signed_in.post(
        f"/agents/{agent.id}/memory/archival/", {"text": "  ", "tags": ""}, HTTP_HX_REQUEST="true"
    )

    assert response.status_code == 422
    assert "Archival memory content must be non-empty text." in response.content.decode()


def test_passages_are_listed_newest_first_in_pages(signed_in: Client, agent: Agent, actor: Actor) -> None:
    archive = archival.agent_archive(actor=actor, agent_id=agent.id, embedding_handle=agent.embedding)
    archival.passage_insert(
        actor=actor,
        archive=archive,
        texts=[f"note number {i:02d}" for i in range(12)],
        embedding_handle=agent.embedding,
    )

    first = signed_in.get(f"/agents/{agent.id}/memory/archival/").content.decode()
    second = signed_in.get(
        f"/agents/{agent.id}/memory/archival/", {"page": 2, "part": "results"}
    ).content.decode()

    assert first.count('data-testid="passage"') == 10
    assert "Page 1 of 2" in first
    assert second.count('data-testid="passage"') == 2
    assert "Page 2 of 2" in second


# --- recall memory ----------------------------------------------------------------------------------------


def test_recall_search_finds_a_message_with_its_role(signed_in: Client, agent: Agent, actor: Actor) -> None:
    run_create(
        actor=actor, agent_id=agent.id, messages=[MessageIn(content="I went hiking in the Alps last week")]
    )
    run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="What is the weather like?")])

    html = signed_in.get(f"/agents/{agent.id}/memory/recall/", {"q": "hiking"}).content.decode()

    assert "1 message matching" in html
    assert "I went hiking in the Alps last week" in html
    assert '<span class="badge role-user">user</span>' in html
    assert "weather" not in html


# --- tenancy ----------------------------------------------------------------------------------------------


@pytest.fixture
def foreign(other_org_actor: Actor, llm: ScriptedLLM) -> dict[str, Any]:
    """Another organisation's agent, block, history entry and passage."""
    agent = _make_agent(other_org_actor, name="Foreign")
    block = _block(agent, "human")
    archive = archival.agent_archive(
        actor=other_org_actor, agent_id=agent.id, embedding_handle=agent.embedding
    )
    [passage] = archival.passage_insert(
        actor=other_org_actor, archive=archive, texts=["secret"], embedding_handle=agent.embedding
    )
    history = block_history(actor=other_org_actor, block_id=block.id).first()
    return {"agent": agent, "block": block, "passage": passage, "history": history}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/agents/{agent}/memory/context/"),
        ("get", "/agents/{agent}/memory/blocks/"),
        ("post", "/agents/{agent}/memory/blocks/{block}/"),
        ("get", "/agents/{agent}/memory/blocks/{block}/history/"),
        ("post", "/agents/{agent}/memory/blocks/{block}/history/{history}/restore/"),
        ("get", "/agents/{agent}/memory/archival/"),
        ("post", "/agents/{agent}/memory/archival/"),
        ("post", "/agents/{agent}/memory/archival/{passage}/delete/"),
        ("get", "/agents/{agent}/memory/recall/"),
    ],
)
def test_another_organisations_agent_is_not_found(
    signed_in: Client, foreign: dict[str, Any], method: str, path: str
) -> None:
    url = path.format(
        agent=foreign["agent"].id,
        block=foreign["block"].id,
        history=foreign["history"].id,
        passage=foreign["passage"].id,
    )

    response = getattr(signed_in, method)(url, {"value": "hacked", "version": 1, "text": "x"})

    assert response.status_code == 404
    foreign["block"].refresh_from_db()
    assert foreign["block"].value == "Name: unknown"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("post", "/agents/{agent}/memory/blocks/{block}/"),
        ("get", "/agents/{agent}/memory/blocks/{block}/history/"),
        ("post", "/agents/{agent}/memory/blocks/{own_block}/history/{history}/restore/"),
        ("post", "/agents/{agent}/memory/archival/{passage}/delete/"),
    ],
)
def test_another_organisations_block_history_or_passage_through_ones_own_agent_is_not_found(
    signed_in: Client, agent: Agent, foreign: dict[str, Any], method: str, path: str
) -> None:
    url = path.format(
        agent=agent.id,
        block=foreign["block"].id,
        own_block=_block(agent, "human").id,
        history=foreign["history"].id,
        passage=foreign["passage"].id,
    )

    response = getattr(signed_in, method)(url, {"value": "hacked", "version": 1})

    assert response.status_code == 404
    foreign["block"].refresh_from_db()
    assert foreign["block"].value == "Name: unknown"
    assert foreign["passage"].__class__.all_objects.filter(id=foreign["passage"].id).exists()


def test_a_block_of_another_agent_in_the_same_organisation_is_not_editable_through_this_one(
    signed_in: Client, agent: Agent, actor: Actor
) -> None:
    other = _make_agent(actor, name="Sibling")
    block = _block(other, "human")

    response = _save(signed_in, agent, block, "changed through the wrong agent")

    block.refresh_from_db()
    assert response.status_code == 404
    assert block.value == "Name: unknown"


def test_the_context_of_another_agents_conversation_is_not_found(
    signed_in: Client, agent: Agent, actor: Actor
) -> None:
    other = _make_agent(actor, name="Sibling")
    conversation = conversation_create(actor=actor, agent_id=other.id)

    response = signed_in.get(f"/agents/{agent.id}/memory/context/", {"conversation": conversation.id})

    assert response.status_code == 404


def test_the_context_of_a_conversation_counts_that_conversations_messages(
    signed_in: Client, agent: Agent, actor: Actor, llm: ScriptedLLM
) -> None:
    conversation = conversation_create(actor=actor, agent_id=agent.id)
    llm.push(llm.text("A long answer about mountains and valleys and rivers, " * 10))
    agent_send_message(
        actor=actor,
        agent_id=agent.id,
        conversation_id=conversation.id,
        messages=[MessageIn(content="Tell me")],
    )

    default = _tokens(signed_in.get(f"/agents/{agent.id}/memory/context/").content.decode())
    threaded = _tokens(
        signed_in.get(
            f"/agents/{agent.id}/memory/context/", {"conversation": conversation.id}
        ).content.decode()
    )

    assert default["messages"] == 0
    assert threaded["messages"] > 100
