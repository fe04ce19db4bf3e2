"""The official Letta SDK (letta-client 1.12.1, unpatched) with identities, against pytest-django's live
server: `agents.identities.attach/detach` and AgentState's `identity_ids`; the SDK has no identity resource,
so /v1/identities is driven with its generic request methods. Only loopback is contacted."""

from collections.abc import Iterator

import pytest
from django.db import connections
from letta_client import ConflictError, Letta, NotFoundError, PermissionDeniedError

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.agents.services import agent_create
from apps.core.actor import Actor, Role
from apps.identities import services
from apps.identities.selectors import AgentLink
from apps.memory.services import block_create

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_persistent_connections_in_server_threads() -> Iterator[None]:
    """The live server answers each request in a new thread: persistent connections would keep the test
    database open (see tests/api/test_agents_sdk.py)."""
    db_settings = connections.settings["default"]
    saved = db_settings["CONN_MAX_AGE"]
    db_settings["CONN_MAX_AGE"] = 0
    yield
    db_settings["CONN_MAX_AGE"] = saved


def sdk_for(live_server, actor) -> Letta:
    raw_key = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="sdk").raw_key
    return Letta(base_url=live_server.url, api_key=raw_key, max_retries=0, timeout=20)


def new_agent(actor, name="Concierge"):
    return agent_create(actor=actor, name=name, model="openai/gpt-4o-mini", include_base_tools=False)


def new_identity(actor, key="user-1"):
    return services.identity_create(actor=actor, identifier_key=key, name="Sam", identity_type="user")


def test_attach_and_detach_an_identity_through_the_sdk(live_server, actor):
    client = sdk_for(live_server, actor)
    agent = new_agent(actor)
    first, second = new_identity(actor, "user-1"), new_identity(actor, "user-2")

    attached = client.agents.identities.attach(first.id, agent_id=agent.id)
    client.agents.identities.attach(second.id, agent_id=agent.id)
    with_both = client.agents.retrieve(agent.id, include=["agent.identities"])
    detached = client.agents.identities.detach(first.id, agent_id=agent.id)
    with_one = client.agents.retrieve(agent.id, include=["agent.identities"])

    assert (attached, detached) == (None, None)
    assert with_both.identity_ids == [first.id, second.id]
    assert with_one.identity_ids == [second.id]
    assert [a.identity_ids for a in client.agents.list(include=["agent.identities"])] == [[second.id]]
    assert [a.identities[0].id for a in client.agents.list(include=["agent.identities"])] == [second.id]
    assert client.agents.retrieve(agent.id).identity_ids == []  # not asked for: none, as on Letta


def test_attach_errors_through_the_sdk(live_server, actor, other_org_actor, make_user, org):
    member_user = make_user(org, role=Role.MEMBER, username="member")
    member = Actor(organization_id=org.id, user_id=member_user.id, role=Role.MEMBER)
    agent = new_agent(actor)
    identity = new_identity(actor)
    theirs = new_identity(other_org_actor)

    with pytest.raises(NotFoundError) as missing:
        sdk_for(live_server, actor).agents.identities.attach(theirs.id, agent_id=agent.id)
    with pytest.raises(PermissionDeniedError) as refused:
        sdk_for(live_server, member).agents.identities.attach(identity.id, agent_id=agent.id)

    assert missing.value.body == {
        "detail": f"Identity with id '{theirs.id}' not found",
        "code": "identity_not_found",
    }
    assert refused.value.body["detail"].startswith("Not allowed (agent 'Concierge')")
    assert not AgentLink.objects.filter(agent_id=agent.id).exists()


def test_identity_crud_through_the_sdks_request_methods(live_server, actor):
    client = sdk_for(live_server, actor)
    body = {"identifier_key": "user-42", "name": "Sam", "identity_type": "user"}

    created = client.post("/v1/identities/", body=body, cast_to=object)
    with pytest.raises(ConflictError):
        client.post("/v1/identities/", body=body, cast_to=object)
    upserted = client.put("/v1/identities/", body={**body, "name": "Samuel"}, cast_to=object)
    properties = client.put(
        f"/v1/identities/{created['id']}/properties",
        body=[{"key": "plan", "value": "pro", "type": "string"}],
        cast_to=object,
    )
    listed = client.get("/v1/identities/", options={"params": {"identifier_key": "user-42"}}, cast_to=object)
    count = client.get("/v1/identities/count", cast_to=object)
    deleted = client.delete(f"/v1/identities/{created['id']}", cast_to=object)

    assert created["id"].startswith("identity-")
    assert (upserted["id"], upserted["name"]) == (created["id"], "Samuel")
    assert properties["properties"] == [{"key": "plan", "value": "pro", "type": "string"}]
    assert [i["id"] for i in listed] == [created["id"]]
    assert (count, deleted) == (1, None)


def test_agents_list_filters_by_identity_through_the_sdk(live_server, actor):
    client = sdk_for(live_server, actor)
    sams, alexs = new_agent(actor, "Sams"), new_agent(actor, "Alexs")
    new_agent(actor, "Nobodys")
    sam = services.identity_create(
        actor=actor, identifier_key="user-sam", name="Sam", identity_type="user", agent_ids=[sams.id]
    )
    services.identity_create(
        actor=actor, identifier_key="user-alex", name="Alex", identity_type="user", agent_ids=[alexs.id]
    )

    by_id = client.agents.list(identity_id=sam.id)
    by_keys = client.agents.list(identifier_keys=["user-sam", "user-alex"])

    assert [a.name for a in by_id] == ["Sams"]
    assert sorted(a.name for a in by_keys) == ["Alexs", "Sams"]


def test_blocks_list_filters_by_identity_through_the_sdk(live_server, actor):
    client = sdk_for(live_server, actor)
    mine = block_create(actor=actor, label="preferences", value="likes tea", limit=100)
    block_create(actor=actor, label="other", value="", limit=100)
    identity = services.identity_create(
        actor=actor, identifier_key="user-1", name="Sam", identity_type="user", block_ids=[mine.id]
    )

    by_id = client.blocks.list(identity_id=identity.id)
    by_keys = client.blocks.list(identifier_keys=["user-1"])

    assert [b.id for b in by_id] == [mine.id]
    assert [b.id for b in by_keys] == [mine.id]
