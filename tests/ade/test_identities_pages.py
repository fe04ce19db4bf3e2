"""The ADE's identity pages (list and filter, create, edit, typed properties, linked agents, delete),
through Django's test client. Who may change an identity is also driven for every role by
test_role_matrix.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.test import Client
from django.urls import reverse

from apps.accounts.models import Organization, User
from apps.agents.models import Agent
from apps.agents.services import agent_create
from apps.core.actor import Actor, Role
from apps.identities import services
from apps.identities.models import Identity


@pytest.fixture
def sam(actor: Actor) -> Identity:
    return services.identity_create(
        actor=actor,
        identifier_key="user-42",
        name="Sam Lee",
        identity_type="user",
        properties=[services.IdentityProperty(key="plan", value="pro", type="string")],
    )


@pytest.fixture
def member(org: Organization, make_user: Callable[..., User]) -> User:
    return make_user(org, role=Role.MEMBER, username="mallory")


def _stored(identity: Identity) -> Identity:
    return Identity.objects.unscoped().get(id=identity.id)


def test_the_list_shows_and_filters_the_organisations_identities(
    owner_client: Client, actor: Actor, sam: Identity, other_org_actor: Actor
) -> None:
    services.identity_create(actor=actor, identifier_key="org-1", name="Acme Corp", identity_type="org")
    services.identity_create(
        actor=other_org_actor, identifier_key="x", name="Sam Stranger", identity_type="user"
    )

    everyone = owner_client.get(reverse("ade:identity-list")).content.decode()
    filtered = owner_client.get(reverse("ade:identity-list"), {"q": "sam"}).content.decode()

    assert everyone.count('data-testid="identity-row"') == 2
    assert "Sam Stranger" not in everyone
    assert filtered.count('data-testid="identity-row"') == 1
    assert 'data-identity-key="user-42"' in filtered


def test_an_identity_is_created_and_a_taken_key_is_refused(
    owner_client: Client, actor: Actor, sam: Identity
) -> None:
    response = owner_client.post(
        reverse("ade:identity-create"), {"identifier_key": "org-7", "name": "Globex", "identity_type": "org"}
    )
    created = Identity.objects.for_actor(actor).get(identifier_key="org-7")
    assert response.status_code == 302
    assert response["Location"] == reverse("ade:identity-detail", args=[created.id])
    assert (created.name, created.identity_type, created.created_by_id) == ("Globex", "org", actor.user_id)

    taken = owner_client.post(
        reverse("ade:identity-create"),
        {"identifier_key": "user-42", "name": "Other", "identity_type": "user"},
    )
    assert taken.status_code == 409
    assert 'data-testid="identity-key-error"' in taken.content.decode()
    assert Identity.objects.for_actor(actor).filter(identifier_key="user-42").count() == 1


def test_the_fields_are_edited(owner_client: Client, sam: Identity) -> None:
    response = owner_client.post(
        reverse("ade:identity-edit", args=[sam.id]),
        {"identifier_key": "user-42", "name": "Samantha Lee", "identity_type": "other"},
    )

    assert response.status_code == 302
    assert (_stored(sam).name, _stored(sam).identity_type) == ("Samantha Lee", "other")


@pytest.mark.parametrize(
    ("kind", "text", "stored"),
    [
        ("number", "42", 42),
        ("number", "3.5", 3.5),
        ("boolean", "TRUE", True),
        ("json", '{"tier": 2}', {"tier": 2}),
        ("string", " spaced ", " spaced "),
    ],
)
def test_a_property_is_stored_with_its_type(
    owner_client: Client, sam: Identity, kind: str, text: str, stored: object
) -> None:
    response = owner_client.post(
        reverse("ade:identity-property-set", args=[sam.id]), {"key": "extra", "type": kind, "value": text}
    )

    assert response.status_code == 302
    assert {"key": "extra", "value": stored, "type": kind} in _stored(sam).properties
    assert {"key": "plan", "value": "pro", "type": "string"} in _stored(sam).properties


def test_setting_an_existing_key_replaces_it_and_remove_drops_it(owner_client: Client, sam: Identity) -> None:
    owner_client.post(
        reverse("ade:identity-property-set", args=[sam.id]),
        {"key": "plan", "type": "string", "value": "free"},
    )
    assert _stored(sam).properties == [{"key": "plan", "value": "free", "type": "string"}]

    owner_client.post(reverse("ade:identity-property-delete", args=[sam.id]), {"key": "plan"})
    assert _stored(sam).properties == []


@pytest.mark.parametrize(
    ("kind", "text", "says"),
    [
        ("number", "lots", "A number property needs a number"),
        ("boolean", "yes", "A boolean property is true or false."),
        ("json", "[1, 2]", "A JSON property needs a JSON object"),
    ],
)
def test_a_value_that_does_not_fit_its_type_is_refused(
    owner_client: Client, sam: Identity, kind: str, text: str, says: str
) -> None:
    response = owner_client.post(
        reverse("ade:identity-property-set", args=[sam.id]), {"key": "bad", "type": kind, "value": text}
    )

    assert response.status_code == 422
    assert says in response.content.decode()
    assert _stored(sam).properties == [{"key": "plan", "value": "pro", "type": "string"}]


def test_agents_are_linked_and_unlinked(owner_client: Client, actor: Actor, sam: Identity) -> None:
    agent = agent_create(actor=actor, name="Concierge", model="openai/gpt-4o-mini")

    page = owner_client.get(reverse("ade:identity-detail", args=[sam.id])).content.decode()
    assert f'<option value="{agent.id}">Concierge</option>' in page
    owner_client.post(reverse("ade:identity-agent-link", args=[sam.id]), {"agent": agent.id})
    assert list(_stored(sam).agents.values_list("id", flat=True)) == [agent.id]
    page = owner_client.get(reverse("ade:identity-detail", args=[sam.id])).content.decode()
    assert 'data-testid="identity-agent"' in page

    owner_client.post(reverse("ade:identity-agent-unlink", args=[sam.id, agent.id]))
    assert not _stored(sam).agents.exists()
    assert Agent.objects.for_actor(actor).filter(id=agent.id).exists()


def test_another_organisations_agent_cannot_be_linked(
    owner_client: Client, sam: Identity, other_org_actor: Actor
) -> None:
    theirs = agent_create(actor=other_org_actor, name="Theirs", model="openai/gpt-4o-mini")

    response = owner_client.post(reverse("ade:identity-agent-link", args=[sam.id]), {"agent": theirs.id})

    assert response.status_code == 404
    assert not _stored(sam).agents.exists()


def test_a_member_sees_but_cannot_change_anothers_identity(
    client: Client, member: User, sam: Identity
) -> None:
    client.force_login(member)

    page = client.get(reverse("ade:identity-detail", args=[sam.id])).content.decode()
    assert 'data-testid="identity-read-only"' in page
    assert 'data-testid="property-form"' not in page
    assert 'data-testid="identity-danger-zone"' not in page

    edited = client.post(
        reverse("ade:identity-edit", args=[sam.id]),
        {"identifier_key": "user-42", "name": "Hijacked", "identity_type": "user"},
    )
    deleted = client.post(reverse("ade:identity-delete", args=[sam.id]))

    assert (edited.status_code, deleted.status_code) == (403, 403)
    assert _stored(sam).name == "Sam Lee"


def test_an_identity_is_deleted_and_its_agents_stay(
    owner_client: Client, actor: Actor, sam: Identity
) -> None:
    agent = agent_create(actor=actor, name="Concierge", model="openai/gpt-4o-mini")
    services.identity_attach_agent(actor=actor, identity_id=sam.id, agent_id=agent.id)

    response = owner_client.post(reverse("ade:identity-delete", args=[sam.id]))

    assert response.status_code == 302
    assert response["Location"] == reverse("ade:identity-list")
    assert not Identity.objects.unscoped().filter(id=sam.id).exists()
    assert Agent.objects.for_actor(actor).filter(id=agent.id).exists()


@pytest.mark.parametrize(
    ("name", "method"),
    [("ade:identity-detail", "get"), ("ade:identity-edit", "post"), ("ade:identity-delete", "post")],
)
def test_another_organisations_identity_is_not_found(
    name: str, method: str, client: Client, user: User, other_org_actor: Actor
) -> None:
    theirs = services.identity_create(
        actor=other_org_actor, identifier_key="secret-key", name="Their VIP", identity_type="user"
    )
    client.force_login(user)

    response = getattr(client, method)(reverse(name, args=[theirs.id]))

    assert response.status_code == 404
    assert "Their VIP" not in response.content.decode()
    assert Identity.objects.unscoped().filter(id=theirs.id).exists()
