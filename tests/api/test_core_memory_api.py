"""/v1/agents/{id}/core-memory/blocks: an agent's blocks by label, and attaching/detaching shared blocks."""

import pytest

from apps.agents.services import BlockSpec, agent_create
from apps.memory.models import AgentBlock, Block, BlockHistory
from tests.factories import BlockFactory
from tests.support.scripted_llm import text


@pytest.fixture
def agent(actor):
    return agent_create(
        actor=actor,
        name="Assistant",
        model="openai/gpt-4o-mini",
        memory_blocks=[
            BlockSpec(label="human", value="Name: Sam", limit=50),
            BlockSpec(label="persona", value="I help"),
        ],
    )


def blocks_url(agent, rest=""):
    return f"/v1/agents/{agent.id}/core-memory/blocks{rest}"


def test_list_returns_the_agents_blocks(actor, api_client_for, agent):
    other = agent_create(actor=actor, name="Other", memory_blocks=[BlockSpec(label="human", value="x")])

    response = api_client_for(actor).get(blocks_url(agent), {"order": "asc"})

    assert response.status_code == 200
    assert [(b["label"], b["value"]) for b in response.json()] == [
        ("human", "Name: Sam"),
        ("persona", "I help"),
    ]
    assert other.blocks.get().id not in [b["id"] for b in response.json()]


def test_list_paginates_with_after_until_an_empty_page(actor, api_client_for, agent):
    for i in range(3):
        block = BlockFactory(organization_id=actor.organization_id, label=f"extra{i}")
        AgentBlock.objects.create(agent=agent, block=block, block_label=block.label)
    client = api_client_for(actor)
    expected = list(Block.objects.for_actor(actor).filter(agents=agent).order_by("created_at", "id"))

    seen, after = [], None
    for _ in range(10):
        page = client.get(
            blocks_url(agent), {"order": "asc", "limit": 2} | ({"after": after} if after else {})
        )
        if not page.json():
            break
        seen += [b["id"] for b in page.json()]
        after = page.json()[-1]["id"]

    assert seen == [b.id for b in expected]
    assert len(seen) == 5


def test_retrieve_by_label(actor, api_client_for, agent):
    response = api_client_for(actor).get(blocks_url(agent, "/human"))

    assert response.status_code == 200
    assert (response.json()["label"], response.json()["value"], response.json()["limit"]) == (
        "human",
        "Name: Sam",
        50,
    )


def test_unknown_label_is_404(actor, api_client_for, agent):
    response = api_client_for(actor).get(blocks_url(agent, "/nope"))

    assert response.status_code == 404
    assert response.json()["detail"] == f"Block with label 'nope' not found on agent '{agent.id}'"


def test_modify_by_label_records_the_user_in_history(actor, api_client_for, agent):
    response = api_client_for(actor).patch(
        blocks_url(agent, "/human"), {"value": "Name: Sam\nLikes tea"}, format="json"
    )

    assert response.status_code == 200
    assert response.json()["value"] == "Name: Sam\nLikes tea"
    block = agent.blocks.get(label="human")
    entry = BlockHistory.objects.for_actor(actor).filter(block=block).order_by("-version").first()
    assert (entry.actor_type, entry.actor_id, entry.value_before, entry.value_after) == (
        "user",
        actor.user_id,
        "Name: Sam",
        "Name: Sam\nLikes tea",
    )


def test_modify_over_the_limit_is_400_and_keeps_the_value(actor, api_client_for, agent):
    response = api_client_for(actor).patch(blocks_url(agent, "/human"), {"value": "x" * 51}, format="json")

    assert response.status_code == 400
    assert response.json()["detail"] == (
        "Block 'human' value is 51 characters, over its limit of 50. Shorten the value or raise the limit."
    )
    assert agent.blocks.get(label="human").value == "Name: Sam"


def test_modify_can_relabel_and_change_the_limit(actor, api_client_for, agent):
    client = api_client_for(actor)

    response = client.patch(blocks_url(agent, "/human"), {"label": "user", "limit": 500}, format="json")

    assert (response.json()["label"], response.json()["limit"]) == ("user", 500)
    assert client.get(blocks_url(agent, "/user")).status_code == 200
    assert client.get(blocks_url(agent, "/human")).status_code == 404


def test_relabelling_onto_another_blocks_label_is_400(actor, api_client_for, agent):
    response = api_client_for(actor).patch(blocks_url(agent, "/human"), {"label": "persona"}, format="json")

    assert response.status_code == 400
    assert "already has another block labelled 'persona'" in response.json()["detail"]


def test_modify_with_a_malformed_body_is_422(actor, api_client_for, agent):
    response = api_client_for(actor).patch(blocks_url(agent, "/human"), {"limit": "many"}, format="json")

    assert response.status_code == 422
    assert "limit" in response.json()["detail"]


def test_attach_and_detach_a_shared_block_return_the_agent_state(actor, api_client_for, agent):
    shared = BlockFactory(organization_id=actor.organization_id, label="project")
    client = api_client_for(actor)

    attached = client.patch(blocks_url(agent, f"/attach/{shared.id}"))
    detached = client.patch(blocks_url(agent, f"/detach/{shared.id}"))

    assert attached.status_code == 200
    assert attached.json()["id"] == agent.id
    assert sorted(b["label"] for b in attached.json()["blocks"]) == ["human", "persona", "project"]
    assert sorted(b["label"] for b in detached.json()["memory"]["blocks"]) == ["human", "persona"]
    assert Block.objects.for_actor(actor).filter(id=shared.id).exists()


def test_attaching_a_block_whose_label_the_agent_has_is_400(actor, api_client_for, agent):
    duplicate = BlockFactory(organization_id=actor.organization_id, label="human")

    response = api_client_for(actor).patch(blocks_url(agent, f"/attach/{duplicate.id}"))

    assert response.status_code == 400
    assert response.json()["detail"] == (
        f"Agent already has a block labelled 'human' ({agent.blocks.get(label='human').id}); "
        "detach it first or use another label"
    )
    assert not AgentBlock.objects.filter(block=duplicate).exists()


def test_a_block_labelled_attach_is_still_reachable_by_label(actor, api_client_for, agent):
    block = BlockFactory(organization_id=actor.organization_id, label="attach", value="routing")
    AgentBlock.objects.create(agent=agent, block=block, block_label="attach")

    response = api_client_for(actor).get(blocks_url(agent, "/attach"))

    assert response.json()["value"] == "routing"


def test_detaching_a_block_that_is_not_attached_is_404(actor, api_client_for, agent):
    loose = BlockFactory(organization_id=actor.organization_id)

    response = api_client_for(actor).patch(blocks_url(agent, f"/detach/{loose.id}"))

    assert response.status_code == 404
    assert response.json()["detail"] == f"Block with id '{loose.id}' is not attached to agent '{agent.id}'"


@pytest.mark.parametrize("action", ["attach", "detach"])
def test_attaching_an_unknown_or_foreign_block_is_404(actor, other_org_actor, api_client_for, agent, action):
    foreign = BlockFactory(organization_id=other_org_actor.organization_id, label="foreign")

    response = api_client_for(actor).patch(blocks_url(agent, f"/{action}/{foreign.id}"))

    assert response.status_code == 404
    assert response.json()["detail"] == f"Block with id '{foreign.id}' not found"
    assert not AgentBlock.objects.filter(block=foreign).exists()


ENDPOINTS = [
    ("get", "", None),
    ("get", "/human", None),
    ("patch", "/human", {"value": "hacked"}),
    ("patch", "/attach/{block}", None),
    ("patch", "/detach/{block}", None),
]


@pytest.mark.parametrize(("method", "rest", "body"), ENDPOINTS)
def test_another_organisation_gets_404_and_changes_nothing(
    actor, other_org_actor, api_client_for, agent, method, rest, body
):
    spare = BlockFactory(organization_id=other_org_actor.organization_id, label="spare")
    human = agent.blocks.get(label="human")
    url = blocks_url(agent, rest.format(block=spare.id))

    response = getattr(api_client_for(other_org_actor), method)(url, body, format="json")

    assert response.status_code == 404
    assert response.json()["detail"] == f"Agent with id '{agent.id}' not found"
    human.refresh_from_db()
    assert human.value == "Name: Sam"
    assert sorted(agent.blocks.values_list("label", flat=True)) == ["human", "persona"]


def test_another_organisation_cannot_attach_my_block_to_its_agent(
    actor, other_org_actor, api_client_for, agent
):
    mine = agent.blocks.get(label="human")
    theirs = agent_create(actor=other_org_actor, name="Theirs")

    response = api_client_for(other_org_actor).patch(
        f"/v1/agents/{theirs.id}/core-memory/blocks/attach/{mine.id}"
    )

    assert response.status_code == 404
    assert not AgentBlock.objects.filter(agent=theirs).exists()


@pytest.mark.django_db(transaction=True)
def test_an_edit_through_one_agent_is_what_every_agent_sharing_the_block_sees_next(
    actor, api_client_for, llm, celery_worker
):
    shared = BlockFactory(organization_id=actor.organization_id, label="team", value="Sprint 1", limit=200)
    first, second = (
        agent_create(actor=actor, name=name, model="openai/gpt-4o-mini", block_ids=[shared.id])
        for name in ("first", "second")
    )
    client = api_client_for(actor)

    edited = client.patch(
        f"/v1/agents/{first.id}/core-memory/blocks/team", {"value": "Sprint 2"}, format="json"
    )
    llm.push(text("Noted."))
    sent = client.post(
        f"/v1/agents/{second.id}/messages", {"messages": [{"role": "user", "content": "hi"}]}, format="json"
    )

    assert (edited.status_code, sent.status_code) == (200, 200)
    system = llm.last_chat_request()["messages"][0]["content"]
    assert "Sprint 2" in system
    assert "Sprint 1" not in system
    assert client.get(f"/v1/agents/{second.id}/core-memory/blocks/team").json()["value"] == "Sprint 2"
