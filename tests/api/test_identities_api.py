"""/v1/identities and attaching identities to agents and blocks, through the API: Letta's shapes, upsert and
merge rules, properties, filters, pagination, the duplicate key's 409, tenancy and the role matrix."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.agents.models import Agent
from apps.agents.services import agent_create
from apps.core.actor import Actor, Role
from apps.core.permissions import Action, allows
from apps.identities import services
from apps.identities.models import Identity
from apps.identities.selectors import AgentLink, BlockLink
from apps.memory.models import Block
from apps.memory.services import block_create

AGENT_MODEL = "openai/gpt-4o-mini"


@pytest.fixture
def client(actor: Actor, api_client_for) -> APIClient:
    return api_client_for(actor)


def new_agent(actor: Actor, name: str = "Concierge") -> Agent:
    return agent_create(actor=actor, name=name, model=AGENT_MODEL, include_base_tools=False)


def new_block(actor: Actor, label: str = "preferences") -> Block:
    return block_create(actor=actor, label=label, value="likes tea", limit=100)


def create(client: APIClient, key: str = "user-1", **body: Any) -> dict:
    body = {"identifier_key": key, "name": "Sam", "identity_type": "user", **body}
    response = client.post("/v1/identities/", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def stored(identity_id: str) -> Identity:
    return Identity.objects.unscoped().get(id=identity_id)


# --- create, retrieve, modify, delete -------------------------------------------------------------------


def test_create_returns_lettas_identity(actor, client):
    agent, block = new_agent(actor), new_block(actor)

    identity = create(
        client,
        "user-42",
        name="Sam Doe",
        agent_ids=[agent.id],
        block_ids=[block.id],
        properties=[
            {"key": "plan", "value": "pro", "type": "string"},
            {"key": "seats", "value": 3, "type": "number"},
            {"key": "trial", "value": False, "type": "boolean"},
            {"key": "prefs", "value": {"lang": "fr"}, "type": "json"},
        ],
    )

    assert identity == {
        "id": identity["id"],
        "identifier_key": "user-42",
        "name": "Sam Doe",
        "identity_type": "user",
        "project_id": None,
        "agent_ids": [agent.id],
        "block_ids": [block.id],
        "organization_id": actor.organization_id,
        "properties": [
            {"key": "plan", "value": "pro", "type": "string"},
            {"key": "seats", "value": 3, "type": "number"},
            {"key": "trial", "value": False, "type": "boolean"},
            {"key": "prefs", "value": {"lang": "fr"}, "type": "json"},
        ],
    }
    assert identity["id"].startswith("identity-")
    assert stored(identity["id"]).created_by_id == actor.user_id


def test_a_duplicate_identifier_key_is_409_and_adds_nothing(actor, client):
    create(client, "user-1")

    response = client.post(
        "/v1/identities/",
        {"identifier_key": "user-1", "name": "Other", "identity_type": "org"},
        format="json",
    )

    assert response.status_code == 409
    assert (
        response.json()["detail"]
        == "An identity with identifier_key 'user-1' already exists in this organization"
    )
    assert list(Identity.objects.for_actor(actor).values_list("name", flat=True)) == ["Sam"]


def test_create_with_an_unknown_agent_is_404_and_creates_nothing(actor, client):
    response = client.post(
        "/v1/identities/",
        {"identifier_key": "user-1", "name": "Sam", "identity_type": "user", "agent_ids": ["agent-missing"]},
        format="json",
    )

    assert response.status_code == 404
    assert response.json()["detail"] == "Agent with id 'agent-missing' not found"
    assert not Identity.objects.for_actor(actor).exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"identity_type": "robot"}, "identity_type"),
        ({"identifier_key": ""}, "identifier_key"),
        ({"properties": [{"key": "tags", "value": ["a"], "type": "json"}]}, "properties"),
        ({"properties": [{"key": "x", "value": None, "type": "string"}]}, "properties"),
        ({"properties": [{"key": "x", "value": "y", "type": "date"}]}, "properties"),
    ],
)
def test_invalid_bodies_are_422_naming_the_field(actor, client, body, field):
    response = client.post(
        "/v1/identities/",
        {"identifier_key": "user-1", "name": "Sam", "identity_type": "user", **body},
        format="json",
    )

    assert response.status_code == 422
    assert field in response.json()["detail"]
    assert not Identity.objects.for_actor(actor).exists()


def test_retrieve_and_a_missing_identity(client):
    identity = create(client)

    found = client.get(f"/v1/identities/{identity['id']}")
    missing = client.get("/v1/identities/identity-missing")

    assert (found.status_code, found.json()) == (200, identity)
    assert (missing.status_code, missing.json()["detail"]) == (
        404,
        "Identity with id 'identity-missing' not found",
    )


def test_modify_merges_properties_and_adds_agents_as_letta_does(actor, client):
    first, second = new_agent(actor, "First"), new_agent(actor, "Second")
    identity = create(
        client, agent_ids=[first.id], properties=[{"key": "plan", "value": "free", "type": "string"}]
    )

    response = client.patch(
        f"/v1/identities/{identity['id']}",
        {
            "name": "Samuel",
            "agent_ids": [second.id],
            "properties": [
                {"key": "plan", "value": "pro", "type": "string"},
                {"key": "seats", "value": 2, "type": "number"},
            ],
        },
        format="json",
    )

    body = response.json()
    assert response.status_code == 200
    assert (body["name"], body["identifier_key"], body["identity_type"]) == ("Samuel", "user-1", "user")
    assert body["agent_ids"] == [first.id, second.id]
    assert body["properties"] == [
        {"key": "plan", "value": "pro", "type": "string"},
        {"key": "seats", "value": 2, "type": "number"},
    ]


def test_modify_to_a_taken_identifier_key_is_409_and_changes_nothing(client):
    create(client, "user-1")
    second = create(client, "user-2")

    response = client.patch(f"/v1/identities/{second['id']}", {"identifier_key": "user-1"}, format="json")

    assert response.status_code == 409
    assert stored(second["id"]).identifier_key == "user-2"


def test_upsert_creates_then_replaces_the_same_identity(actor, client):
    first, second = new_agent(actor, "First"), new_agent(actor, "Second")
    body = {"identifier_key": "user-1", "name": "Sam", "identity_type": "user", "agent_ids": [first.id]}

    created = client.put("/v1/identities/", body, format="json")
    replaced = client.put(
        "/v1/identities/",
        {
            **body,
            "name": "Sam B",
            "agent_ids": [second.id],
            "properties": [{"key": "tier", "value": 1, "type": "number"}],
        },
        format="json",
    )

    assert (created.status_code, replaced.status_code) == (200, 200)
    assert replaced.json()["id"] == created.json()["id"]
    assert created.json()["agent_ids"] == [first.id]
    assert (replaced.json()["name"], replaced.json()["agent_ids"]) == ("Sam B", [second.id])
    assert replaced.json()["properties"] == [{"key": "tier", "value": 1, "type": "number"}]
    assert Identity.objects.for_actor(actor).count() == 1


def test_upserting_properties_replaces_them_all(client):
    identity = create(client, properties=[{"key": "plan", "value": "free", "type": "string"}])

    response = client.put(
        f"/v1/identities/{identity['id']}/properties",
        [{"key": "vip", "value": True, "type": "boolean"}, {"key": "vip", "value": False, "type": "boolean"}],
        format="json",
    )

    assert response.status_code == 200
    assert response.json()["properties"] == [{"key": "vip", "value": False, "type": "boolean"}]
    assert stored(identity["id"]).properties == [{"key": "vip", "value": False, "type": "boolean"}]


def test_delete_answers_null_and_leaves_its_agents_and_blocks(actor, client):
    agent, block = new_agent(actor), new_block(actor)
    identity = create(client, agent_ids=[agent.id], block_ids=[block.id])

    response = client.delete(f"/v1/identities/{identity['id']}")
    again = client.delete(f"/v1/identities/{identity['id']}")

    assert (response.status_code, response.content) == (200, b"null")
    assert again.status_code == 404
    assert not Identity.objects.unscoped().filter(id=identity["id"]).exists()
    assert Agent.objects.for_actor(actor).filter(id=agent.id).exists()
    assert Block.objects.for_actor(actor).filter(id=block.id).exists()


# --- list, filters, pagination, count --------------------------------------------------------------------


def test_list_filters_as_letta_does(client):
    create(client, "user-1", name="Sam Doe", project_id="proj-a")
    create(client, "user-2", name="Alex Roe", identity_type="user")
    create(client, "acme", name="ACME Inc", identity_type="org")

    def keys(**params: str) -> list[str]:
        response = client.get("/v1/identities/", params)
        assert response.status_code == 200, response.content
        return [identity["identifier_key"] for identity in response.json()]

    assert keys() == ["acme", "user-2", "user-1"]  # newest first
    assert keys(name="sam") == ["user-1"]  # part of the name, any case
    assert keys(identifier_key="user-2") == ["user-2"]
    assert keys(identity_type="org") == ["acme"]
    assert keys(project_id="proj-a") == ["user-1"]
    assert keys(identifier_key="nobody") == []


def test_list_pages_with_cursors_until_an_empty_page(client):
    ids = [create(client, f"user-{i}")["id"] for i in range(5)]

    first = client.get("/v1/identities/", {"limit": 2, "order": "asc"}).json()
    second = client.get("/v1/identities/", {"limit": 2, "order": "asc", "after": first[-1]["id"]}).json()
    third = client.get("/v1/identities/", {"limit": 2, "order": "asc", "after": second[-1]["id"]}).json()
    past = client.get("/v1/identities/", {"limit": 2, "order": "asc", "after": third[-1]["id"]}).json()
    before = client.get("/v1/identities/", {"before": ids[2]}).json()  # earlier in newest-first order

    assert [i["id"] for i in first + second + third] == ids
    assert past == []
    assert [i["id"] for i in before] == [ids[4], ids[3]]


def test_an_invalid_identity_type_filter_is_422(client):
    response = client.get("/v1/identities/", {"identity_type": "robot"})

    assert response.status_code == 422


def test_count_counts_the_organisations_identities(client, other_org_actor, api_client_for):
    create(client, "user-1")
    create(client, "user-2")
    create(api_client_for(other_org_actor), "user-1")

    response = client.get("/v1/identities/count")

    assert (response.status_code, response.json()) == (200, 2)


def test_list_costs_a_fixed_number_of_queries(actor, client, django_assert_num_queries):
    agent = new_agent(actor)
    for i in range(4):
        create(client, f"user-{i}", agent_ids=[agent.id])
    client.get("/v1/identities/count")  # the key's first use records last_used_at: keep it out of the count

    with django_assert_num_queries(4):  # the key with its membership, the page, its agents, its blocks
        response = client.get("/v1/identities/")

    assert [i["agent_ids"] for i in response.json()] == [[agent.id]] * 4


def test_an_identitys_agents_and_blocks(actor, client):
    agent, other_agent = new_agent(actor, "Mine"), new_agent(actor, "Other")
    block, other_block = new_block(actor, "a"), new_block(actor, "b")
    identity = create(client, agent_ids=[agent.id], block_ids=[block.id])

    agents = client.get(f"/v1/identities/{identity['id']}/agents", {"include": "agent.identities"})
    blocks = client.get(f"/v1/identities/{identity['id']}/blocks")
    missing = client.get("/v1/identities/identity-missing/agents")

    assert [a["id"] for a in agents.json()] == [agent.id]
    assert agents.json()[0]["identity_ids"] == [identity["id"]]
    assert [b["id"] for b in blocks.json()] == [block.id]
    assert missing.status_code == 404
    assert other_agent.id not in {a["id"] for a in agents.json()}
    assert other_block.id not in {b["id"] for b in blocks.json()}


# --- attaching to agents and blocks -----------------------------------------------------------------------


def test_attach_and_detach_to_an_agent_show_in_its_identity_ids(actor, client):
    agent = new_agent(actor)
    first, second = create(client, "user-1"), create(client, "user-2")

    attached = [
        client.patch(f"/v1/agents/{agent.id}/identities/attach/{identity['id']}")
        for identity in (first, second)
    ]
    twice = client.patch(f"/v1/agents/{agent.id}/identities/attach/{first['id']}")
    after_attach = client.get(f"/v1/agents/{agent.id}", {"include": "agent.identities"}).json()[
        "identity_ids"
    ]
    detached = client.patch(f"/v1/agents/{agent.id}/identities/detach/{first['id']}")
    not_attached = client.patch(f"/v1/agents/{agent.id}/identities/detach/{first['id']}")
    listed = client.get("/v1/agents/", {"include": "agent.identities"}).json()

    assert [r.status_code for r in [*attached, twice, detached, not_attached]] == [200] * 5
    assert attached[0].content == b"null"
    assert after_attach == [first["id"], second["id"]]
    assert [a["identity_ids"] for a in listed] == [[second["id"]]]
    assert AgentLink.objects.filter(agent_id=agent.id).count() == 1


def test_attach_and_detach_to_a_block_answer_the_block(actor, client):
    block = new_block(actor)
    identity = create(client)

    attached = client.patch(f"/v1/blocks/{block.id}/identities/attach/{identity['id']}")
    linked = client.get(f"/v1/identities/{identity['id']}").json()["block_ids"]
    detached = client.patch(f"/v1/blocks/{block.id}/identities/detach/{identity['id']}")

    assert (attached.status_code, attached.json()["id"], attached.json()["label"]) == (
        200,
        block.id,
        "preferences",
    )
    assert linked == [block.id]
    assert detached.status_code == 200
    assert not BlockLink.objects.filter(block_id=block.id).exists()


# --- tenancy and authentication -------------------------------------------------------------------------


@pytest.fixture
def foreign(actor, other_org_actor, api_client_for) -> dict[str, Any]:
    """Our identity, agent and block, and the other organisation's client, agent and block."""
    identity = create(api_client_for(actor), "user-1")
    return {
        "identity": identity["id"],
        "agent": new_agent(actor).id,
        "block": new_block(actor).id,
        "their_agent": new_agent(other_org_actor, "Theirs").id,
        "their_block": new_block(other_org_actor).id,
        "client": api_client_for(other_org_actor),
    }


@pytest.mark.parametrize(
    ("method", "path", "body", "missing"),
    [
        ("get", "/v1/identities/{identity}", None, "identity"),
        ("patch", "/v1/identities/{identity}", {"name": "stolen"}, "identity"),
        ("delete", "/v1/identities/{identity}", None, "identity"),
        ("put", "/v1/identities/{identity}/properties", [], "identity"),
        ("get", "/v1/identities/{identity}/agents", None, "identity"),
        ("get", "/v1/identities/{identity}/blocks", None, "identity"),
        ("patch", "/v1/agents/{their_agent}/identities/attach/{identity}", None, "identity"),
        ("patch", "/v1/agents/{agent}/identities/attach/{identity}", None, "agent"),
        ("patch", "/v1/agents/{agent}/identities/detach/{identity}", None, "agent"),
        ("patch", "/v1/blocks/{their_block}/identities/attach/{identity}", None, "identity"),
        ("patch", "/v1/blocks/{block}/identities/attach/{identity}", None, "block"),
    ],
)
def test_another_organisation_gets_404_and_changes_nothing(actor, foreign, method, path, body, missing):
    ids = {key: value for key, value in foreign.items() if key != "client"}

    response = getattr(foreign["client"], method)(path.format(**ids), body, format="json")

    assert response.status_code == 404
    label = {"identity": "Identity", "agent": "Agent", "block": "Block"}[missing]
    assert response.json()["detail"] == f"{label} with id '{ids[missing]}' not found"
    identity = stored(foreign["identity"])
    assert identity.name == "Sam"
    assert (identity.agents.count(), identity.blocks.count()) == (0, 0)


def test_another_organisations_agents_and_blocks_cannot_be_linked_on_create(foreign):
    response = foreign["client"].post(
        "/v1/identities/",
        {"identifier_key": "x", "name": "X", "identity_type": "user", "block_ids": [foreign["block"]]},
        format="json",
    )

    assert response.status_code == 404
    assert response.json()["detail"] == f"Block with id '{foreign['block']}' not found"
    assert Identity.objects.unscoped().filter(identifier_key="x").count() == 0


def test_another_organisation_neither_lists_nor_upserts_over_our_identity(foreign):
    listed = foreign["client"].get("/v1/identities/").json()
    upserted = foreign["client"].put(
        "/v1/identities/",
        {"identifier_key": "user-1", "name": "Theirs", "identity_type": "user"},
        format="json",
    )

    assert listed == []
    assert upserted.status_code == 200
    assert upserted.json()["id"] != foreign["identity"]
    assert stored(foreign["identity"]).name == "Sam"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/v1/identities/"),
        ("post", "/v1/identities/"),
        ("put", "/v1/identities/"),
        ("get", "/v1/identities/count"),
        ("get", "/v1/identities/identity-1"),
        ("patch", "/v1/identities/identity-1"),
        ("delete", "/v1/identities/identity-1"),
        ("put", "/v1/identities/identity-1/properties"),
        ("patch", "/v1/agents/agent-1/identities/attach/identity-1"),
        ("patch", "/v1/blocks/block-1/identities/detach/identity-1"),
    ],
)
@pytest.mark.django_db
def test_requests_without_a_key_are_401(method, path):
    body = {"identifier_key": "k", "name": "x", "identity_type": "user"}

    response = getattr(APIClient(), method)(path, body, format="json")

    assert response.status_code == 401
    assert not Identity.objects.unscoped().exists()


# --- the role matrix ------------------------------------------------------------------------------------

ROLES = ("owner", "admin", "creator", "member")


@dataclass
class World:
    """One organisation: its people, and the agent, block and identity the member called "creator" made."""

    actors: dict[str, Actor]
    agent: Agent
    block: Block
    identity: Identity


@pytest.fixture
def world(org, make_user) -> World:
    actors = {}
    for name, role in (
        ("owner", Role.OWNER),
        ("admin", Role.ADMIN),
        ("creator", Role.MEMBER),
        ("member", Role.MEMBER),
    ):
        user = make_user(org, role=role, username=name)
        actors[name] = Actor(organization_id=org.id, user_id=user.id, role=role)
    creator = actors["creator"]
    return World(
        actors=actors,
        agent=new_agent(creator, "Creators"),
        block=new_block(creator),
        identity=services.identity_create(
            actor=creator, identifier_key="user-1", name="Creators identity", identity_type="user"
        ),
    )


def _identity(world: World) -> Identity:
    return stored(world.identity.id)


def _agent_linked(world: World) -> bool:
    return AgentLink.objects.filter(identity_id=world.identity.id, agent_id=world.agent.id).exists()


def _block_linked(world: World) -> bool:
    return BlockLink.objects.filter(identity_id=world.identity.id, block_id=world.block.id).exists()


def _link_agent(world: World) -> None:
    AgentLink.objects.create(identity_id=world.identity.id, agent_id=world.agent.id)


def _link_block(world: World) -> None:
    BlockLink.objects.create(identity_id=world.identity.id, block_id=world.block.id)


@dataclass(frozen=True)
class Case:
    name: str
    action: Action
    act: Callable[[APIClient, World], Any]
    changed: Callable[[World], bool]
    prepare: Callable[[World], None] = lambda world: None
    by_creator: bool = True


NEW = {"identifier_key": "fresh", "name": "Fresh", "identity_type": "user"}

CASES = [
    Case(
        "create an identity",
        Action.IDENTITY_CREATE,
        lambda c, w: c.post("/v1/identities/", NEW, format="json"),
        lambda w: Identity.objects.unscoped().filter(identifier_key="fresh").exists(),
        by_creator=False,
    ),
    Case(
        "upsert a new identity",
        Action.IDENTITY_CREATE,
        lambda c, w: c.put("/v1/identities/", NEW, format="json"),
        lambda w: Identity.objects.unscoped().filter(identifier_key="fresh").exists(),
        by_creator=False,
    ),
    Case(
        "upsert over a stored identity",
        Action.IDENTITY_WRITE,
        lambda c, w: c.put(
            "/v1/identities/",
            {"identifier_key": "user-1", "name": "renamed", "identity_type": "user"},
            format="json",
        ),
        lambda w: _identity(w).name == "renamed",
    ),
    Case(
        "modify an identity",
        Action.IDENTITY_WRITE,
        lambda c, w: c.patch(f"/v1/identities/{w.identity.id}", {"name": "renamed"}, format="json"),
        lambda w: _identity(w).name == "renamed",
    ),
    Case(
        "upsert its properties",
        Action.IDENTITY_WRITE,
        lambda c, w: c.put(
            f"/v1/identities/{w.identity.id}/properties",
            [{"key": "plan", "value": "pro", "type": "string"}],
            format="json",
        ),
        lambda w: _identity(w).properties == [{"key": "plan", "value": "pro", "type": "string"}],
    ),
    Case(
        "delete an identity",
        Action.IDENTITY_WRITE,
        lambda c, w: c.delete(f"/v1/identities/{w.identity.id}"),
        lambda w: not Identity.objects.unscoped().filter(id=w.identity.id).exists(),
    ),
    Case(
        "attach to an agent",
        Action.IDENTITY_WRITE,  # and AGENT_CONFIGURE: both are the creator's here
        lambda c, w: c.patch(f"/v1/agents/{w.agent.id}/identities/attach/{w.identity.id}"),
        _agent_linked,
    ),
    Case(
        "detach from an agent",
        Action.IDENTITY_WRITE,
        lambda c, w: c.patch(f"/v1/agents/{w.agent.id}/identities/detach/{w.identity.id}"),
        lambda w: not _agent_linked(w),
        prepare=_link_agent,
    ),
    Case(
        "link an agent by modifying",
        Action.IDENTITY_WRITE,
        lambda c, w: c.patch(f"/v1/identities/{w.identity.id}", {"agent_ids": [w.agent.id]}, format="json"),
        _agent_linked,
    ),
    Case(
        "attach to a block",
        Action.IDENTITY_WRITE,  # and BLOCK_WRITE
        lambda c, w: c.patch(f"/v1/blocks/{w.block.id}/identities/attach/{w.identity.id}"),
        _block_linked,
    ),
    Case(
        "detach from a block",
        Action.IDENTITY_WRITE,
        lambda c, w: c.patch(f"/v1/blocks/{w.block.id}/identities/detach/{w.identity.id}"),
        lambda w: not _block_linked(w),
        prepare=_link_block,
    ),
]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_api_does_what_the_matrix_says(case: Case, role: str, world: World, api_client_for: Any) -> None:
    case.prepare(world)
    actor = world.actors[role]
    creator_id = world.actors["creator"].user_id if case.by_creator else None
    expected = allows(actor, case.action, creator_id=creator_id)

    response = case.act(api_client_for(actor), world)

    if expected:
        assert response.status_code == 200, response.content
        assert case.changed(world) is True
    else:
        assert response.status_code == 403, response.content
        assert response.json()["detail"].startswith("Not allowed"), response.json()
        assert not case.changed(world)


def test_attaching_ones_identity_to_someone_elses_agent_is_refused(world, api_client_for):
    member = world.actors["member"]
    identity = services.identity_create(
        actor=member, identifier_key="m", name="Members", identity_type="user"
    )

    response = api_client_for(member).patch(f"/v1/agents/{world.agent.id}/identities/attach/{identity.id}")

    assert response.status_code == 403
    assert response.json()["detail"].startswith("Not allowed (agent 'Creators')")
    assert not AgentLink.objects.filter(agent_id=world.agent.id).exists()


def test_creating_an_identity_with_someone_elses_agent_is_refused_and_creates_nothing(world, api_client_for):
    response = api_client_for(world.actors["member"]).post(
        "/v1/identities/", {**NEW, "agent_ids": [world.agent.id]}, format="json"
    )

    assert response.status_code == 403
    assert response.json()["detail"].startswith("Not allowed (agent 'Creators')")
    assert not Identity.objects.unscoped().filter(identifier_key="fresh").exists()


def test_linking_someone_elses_block_to_ones_identity_is_refused(world, api_client_for):
    member = world.actors["member"]
    identity = services.identity_create(
        actor=member, identifier_key="m", name="Members", identity_type="user"
    )

    response = api_client_for(member).patch(
        f"/v1/identities/{identity.id}", {"block_ids": [world.block.id]}, format="json"
    )

    assert response.status_code == 403
    assert response.json()["detail"].startswith("Not allowed (block 'preferences')")
    assert not BlockLink.objects.filter(identity_id=identity.id).exists()
