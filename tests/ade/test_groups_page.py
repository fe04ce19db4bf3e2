"""The ADE's group pages: the organisation's groups, a group's shared timeline (each message marked with
its speaker), sending to the group, the turn's partial the page streams while the group answers (it names the current
speaker's run; tests/ade/browser/test_groups.py follows it in a browser), cancel.
Turns are driven in this process (`drive`, what RUN_EXECUTOR=in_process does) with the scripted LLM."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from apps.accounts.models import Organization, User
from apps.agents.group_turns import advance, drive
from apps.agents.groups import group_create, group_turn_create
from apps.agents.models import Agent, Group, GroupTurn
from apps.agents.services import BlockSpec, agent_create
from apps.core.actor import Actor, Role
from apps.core.permissions import Action, allows
from tests.support.scripted_llm import ScriptedLLM, text

pytestmark = pytest.mark.django_db

MakeAgent = Callable[..., Agent]
LIVE = 'data-live="1"'
POLLING = 'hx-trigger="every'


def htmx_post(client: Client, url: str, data: dict[str, Any]) -> Any:
    return client.post(url, data, HTTP_HX_REQUEST="true")


@pytest.fixture
def pair(actor: Actor, make_agent: MakeAgent) -> Group:
    alice, bob = make_agent(name="Alice"), make_agent(name="Bob")
    return group_create(actor=actor, agent_ids=[alice.id, bob.id], description="The pair")


@pytest.fixture
def member_client(org: Organization, make_user: Callable[..., User]) -> Client:
    client = Client()
    client.force_login(make_user(org, role=Role.MEMBER, username="mia"))
    return client


def test_the_agent_list_links_to_the_groups_and_a_member_sees_them(
    member_client: Client, pair: Group, other_org_actor: Actor
) -> None:
    other = _other_org_group(other_org_actor)

    agents_page = member_client.get(reverse("ade:agent-list")).content.decode()
    listing = member_client.get(reverse("ade:group-list"))
    body = listing.content.decode()

    assert reverse("ade:group-list") in agents_page
    assert listing.status_code == 200
    assert "The pair" in body
    assert "round_robin" in body
    assert "Alice, Bob" in body
    assert reverse("ade:group-detail", args=[pair.id]) in body
    assert other.id not in body


def test_the_group_page_renders_for_a_member_with_a_composer(member_client: Client, pair: Group) -> None:
    response = member_client.get(reverse("ade:group-detail", args=[pair.id]))

    body = response.content.decode()
    assert response.status_code == 200
    assert "The pair" in body
    assert "Alice, Bob" in body
    assert 'data-testid="group-composer"' in body
    assert reverse("ade:group-send", args=[pair.id]) in body
    assert 'data-testid="group-empty"' in body


def test_another_organisations_group_is_not_found(owner_client: Client, other_org_actor: Actor) -> None:
    other = _other_org_group(other_org_actor)
    turn = group_turn_create(actor=other_org_actor, group_id=other.id, messages=[{"content": "hi"}])

    responses = [
        owner_client.get(reverse("ade:group-detail", args=[other.id])),
        owner_client.get(reverse("ade:group-turn", args=[other.id, turn.id])),
        htmx_post(owner_client, reverse("ade:group-send", args=[other.id]), {"text": "hello"}),
        htmx_post(owner_client, reverse("ade:group-turn-cancel", args=[other.id, turn.id]), {}),
    ]

    assert [r.status_code for r in responses] == [404] * 4
    assert GroupTurn.all_objects.filter(group=other).count() == 1
    turn.refresh_from_db()
    assert turn.status == "created"


def test_a_turn_of_another_group_is_not_found_under_this_one(
    owner_client: Client, actor: Actor, pair: Group, make_agent: MakeAgent
) -> None:
    solo = group_create(actor=actor, agent_ids=[make_agent(name="Solo").id], description="solo")
    turn = group_turn_create(actor=actor, group_id=solo.id, messages=[{"content": "hi"}])

    response = owner_client.get(reverse("ade:group-turn", args=[pair.id, turn.id]))

    assert response.status_code == 404


def test_sending_starts_a_turn_whose_replies_appear_marked_with_their_speakers(
    owner_client: Client, pair: Group, llm: ScriptedLLM, django_capture_on_commit_callbacks: Any
) -> None:
    llm.push(text("Alice here"), text("Bob here"))

    with django_capture_on_commit_callbacks() as submitted:
        sent = htmx_post(
            owner_client, reverse("ade:group-send", args=[pair.id]), {"text": "introduce yourselves"}
        )

    turn = GroupTurn.all_objects.get(group=pair)
    body = sent.content.decode()
    assert sent.status_code == 200
    assert len(submitted) == 1  # handed to a worker once committed
    assert f'data-turn-id="{turn.id}"' in body
    assert "introduce yourselves" in body
    assert LIVE in body  # the page streams the turn while it is in progress...
    assert POLLING not in body  # ...without polling it
    assert reverse("ade:group-turn", args=[pair.id, turn.id]) in body
    assert reverse("ade:group-turn-cancel", args=[pair.id, turn.id]) in body

    drive(turn.id)

    partial = owner_client.get(reverse("ade:group-turn", args=[pair.id, turn.id])).content.decode()
    assert LIVE not in partial  # ended: nothing more to stream
    assert 'data-testid="cancel"' not in partial
    assert _said(partial) == [("Alice", "Alice here"), ("Bob", "Bob here")]
    assert partial.count("introduce yourselves") == 1
    page = owner_client.get(reverse("ade:group-detail", args=[pair.id])).content.decode()
    assert _said(page) == [("Alice", "Alice here"), ("Bob", "Bob here")]
    assert "introduce yourselves" in page
    assert LIVE not in page


def test_an_empty_message_is_refused_and_starts_nothing(owner_client: Client, pair: Group) -> None:
    response = htmx_post(owner_client, reverse("ade:group-send", args=[pair.id]), {"text": "  "})

    assert response.status_code == 422
    assert "Write a message first." in response.content.decode()
    assert not GroupTurn.all_objects.filter(group=pair).exists()


def test_the_page_streams_the_current_speakers_run_and_cancel_ends_the_turn(
    owner_client: Client, actor: Actor, pair: Group
) -> None:
    turn = group_turn_create(actor=actor, group_id=pair.id, messages=[{"content": "take your time"}])
    advance(turn.id)  # the first speaker's run is created
    turn.refresh_from_db()
    page = owner_client.get(reverse("ade:group-detail", args=[pair.id])).content.decode()
    assert LIVE in page
    assert f'data-run-id="{turn.current_run_id}"' in page
    assert 'data-speaker="Alice"' in page
    assert "ade/group.js" in page
    assert 'data-testid="cancel"' in page
    assert "take your time" in page

    response = htmx_post(owner_client, reverse("ade:group-turn-cancel", args=[pair.id, turn.id]), {})

    turn.refresh_from_db()
    body = response.content.decode()
    assert response.status_code == 200
    assert (turn.status, turn.stop_reason) == ("cancelled", "cancelled")
    assert LIVE not in body
    assert 'data-testid="cancel"' not in body
    assert 'data-testid="stop-reason"' in body


@pytest.mark.parametrize("role", [Role.OWNER, Role.ADMIN, Role.MEMBER])
def test_the_controls_follow_the_role_matrix(
    role: Role, org: Organization, actor: Actor, pair: Group, make_user: Callable[..., User]
) -> None:
    person = make_user(org, role=role, username=f"p-{role}")
    viewer = Actor(organization_id=org.id, user_id=person.id, role=role)
    client = Client()
    client.force_login(person)
    group_turn_create(actor=actor, group_id=pair.id, messages=[{"content": "busy"}])

    page = client.get(reverse("ade:group-detail", args=[pair.id])).content.decode()

    assert ('data-testid="cancel"' in page) is allows(viewer, Action.RUN_CANCEL)
    assert ('data-testid="group-composer"' in page) is allows(viewer, Action.AGENT_USE)


def _said(html: str) -> list[tuple[str, str]]:
    """(speaker, text) of every assistant message, in page order."""
    pattern = re.compile(
        r'data-testid="speaker">([^<]*)</div>\s*<div class="ev ev-assistant"[^>]*><div class="bubble">([^<]*)</div>'
    )
    return pattern.findall(html)


def _other_org_group(other_org_actor: Actor) -> Group:
    agent = agent_create(
        actor=other_org_actor,
        name="Stranger",
        model="openai/gpt-4o-mini",
        embedding="openai/text-embedding-3-small",
        memory_blocks=[BlockSpec(label="human", value="", limit=2000)],
    )
    return group_create(actor=other_org_actor, agent_ids=[agent.id], description="Globex group")
