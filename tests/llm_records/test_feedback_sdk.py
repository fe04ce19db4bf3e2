"""Step feedback through the official SDK (letta-client): set, filtered, cleared."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from letta_client import Letta

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.agents.models import Step
from apps.agents.services import MessageIn, agent_send_message
from apps.core.actor import Actor
from tests.api.test_messages_api import new_agent
from tests.support.scripted_llm import text

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_persistent_connections_in_server_threads() -> Iterator[None]:
    db_settings = connections.settings["default"]
    saved = db_settings["CONN_MAX_AGE"]
    db_settings["CONN_MAX_AGE"] = 0
    yield
    db_settings["CONN_MAX_AGE"] = saved


@pytest.fixture
def sdk(live_server: Any, actor: Actor) -> Letta:
    key = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="sdk")
    return Letta(base_url=live_server.url, api_key=key.raw_key, timeout=30)


def test_feedback_is_set_filtered_and_cleared_through_the_sdk(sdk, actor, llm):
    agent = new_agent(actor)
    llm.push(text("one"), text("two"))
    for words in ("first", "second"):
        agent_send_message(actor=actor, agent_id=agent.id, messages=[MessageIn(content=words)])
    good, bad = Step.objects.for_actor(actor).order_by("created_at")

    # The note is this server's extension of Letta's body: the SDK sends it as an extra field.
    sdk.steps.feedback.create(
        good.id, feedback="positive", tags=["helpful"], extra_body={"note": "Right tone"}
    )
    sdk.steps.feedback.create(bad.id, feedback="negative", tags=["wrong tool"])
    positive = [s.id for s in sdk.steps.list(feedback="positive")]
    rated = sorted(s.id for s in sdk.steps.list(has_feedback=True, agent_id=agent.id))
    cleared = sdk.steps.feedback.create(bad.id, feedback=None)

    assert positive == [good.id]
    assert rated == sorted([good.id, bad.id])
    assert sdk.steps.retrieve(good.id).tags == ["helpful"]
    assert Step.objects.for_actor(actor).get(id=good.id).feedback_note == "Right tone"
    assert sdk.steps.retrieve(good.id).model_extra["feedback_note"] == "Right tone"
    assert cleared.feedback is None
    assert [s.id for s in sdk.steps.list(has_feedback=True)] == [good.id]
