"""The identity admin: saves go through apps.identities.services, so the role matrix and the link checks
decide there as they do in the API."""

from __future__ import annotations

from html import unescape

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from apps.accounts.models import Membership
from apps.core.actor import Role
from apps.identities.models import Identity
from apps.identities.services import identity_create
from tests.admin.html_form import form_data
from tests.factories import AgentFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def make_staff(org):
    """A staff user (not a superuser) with every Django model permission, so only the role decides."""

    def make(role: Role):
        staff = UserFactory(is_staff=True)
        Membership.objects.create(user=staff, organization=org, role=role)
        staff.user_permissions.set(Permission.objects.all())
        return staff

    return make


def add_form(org, **fields):
    return {
        "organization": org.id,
        "identifier_key": "user-1",
        "name": "Sam",
        "identity_type": "user",
        "project_id": "",
        "properties": "[]",
        **fields,
    }


def test_a_member_adds_an_identity_linked_to_their_own_agent(client, make_staff, org):
    member = make_staff(Role.MEMBER)
    agent = AgentFactory(organization=org, created_by=member)
    client.force_login(member)

    response = client.post(
        reverse("admin:identities_identity_add"),
        add_form(org, agents=[agent.id], properties='[{"key": "plan", "value": "pro", "type": "string"}]'),
    )

    assert response.status_code == 302, unescape(response.content.decode())
    identity = Identity.all_objects.get(organization=org, identifier_key="user-1")
    assert identity.created_by_id == member.id
    assert [a.id for a in identity.agents.all()] == [agent.id]
    assert identity.properties == [{"key": "plan", "value": "pro", "type": "string"}]


def test_a_member_cannot_link_an_agent_someone_else_created_and_nothing_is_saved(
    client, make_staff, org, user
):
    member = make_staff(Role.MEMBER)
    theirs = AgentFactory(organization=org, name="owners agent", created_by=user)
    client.force_login(member)

    response = client.post(
        reverse("admin:identities_identity_add"), add_form(org, agents=[theirs.id]), follow=True
    )

    assert response.status_code == 200
    assert "Not allowed (agent 'owners agent'): only its creator" in unescape(response.content.decode())
    assert not Identity.all_objects.filter(organization=org).exists()


def test_properties_that_are_not_key_value_type_objects_are_a_form_error(client, make_staff, org):
    client.force_login(make_staff(Role.OWNER))

    response = client.post(
        reverse("admin:identities_identity_add"), add_form(org, properties='[{"key": "x"}]')
    )

    assert response.status_code == 200
    assert "A property is an object with exactly key, value and type" in unescape(response.content.decode())
    assert not Identity.all_objects.filter(organization=org).exists()


def test_a_member_sees_someone_elses_identity_read_only(client, make_staff, org, actor):
    identity = identity_create(actor=actor, identifier_key="user-1", name="Sam", identity_type="user")
    client.force_login(make_staff(Role.MEMBER))
    url = reverse("admin:identities_identity_change", args=[identity.id])

    page = client.get(url)
    response = client.post(url, {"name": "renamed"})

    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    assert response.status_code == 403
    assert Identity.all_objects.get(id=identity.id).name == "Sam"


def test_an_owner_changes_the_linked_agents_through_the_form(client, org, actor, user):
    user.is_staff = True
    user.save()
    user.user_permissions.set(Permission.objects.all())
    first, second = AgentFactory(organization=org), AgentFactory(organization=org)
    identity = identity_create(
        actor=actor, identifier_key="user-1", name="Sam", identity_type="user", agent_ids=[first.id]
    )
    client.force_login(user)
    url = reverse("admin:identities_identity_change", args=[identity.id])
    data = form_data(client.get(url).content.decode(), "identity_form")
    data["agents"] = [second.id]
    data["project_id"] = ["proj-a"]

    response = client.post(url, data)

    assert response.status_code == 302
    stored = Identity.all_objects.get(id=identity.id)
    assert [a.id for a in stored.agents.all()] == [second.id]
    assert stored.project_id == "proj-a"
