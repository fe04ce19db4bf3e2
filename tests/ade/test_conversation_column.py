"""The workspace's conversation column: history, sending (as the user or a system event), approvals,
conversations, cancelling; runs are executed in-process here (the browser tests use the real worker)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.html import escape

from apps.agents.models import Message, Run
from apps.agents.services import (
    MessageIn,
    conversation_create,
    run_create,
)
from apps.agents.system_messages import THREAD_SYSTEM_MESSAGE
from apps.core.actor import Role
from tests.factories import AgentFactory
from tests.support.scripted_llm import text, tool_call, tool_calls

pytestmark = pytest.mark.django_db

APPROVAL_RULES = [{"type": "requires_approval", "tool_name": "memory_insert"}]


def column_url(agent, **params):
    url = reverse("ade:conversation-column", args=[agent.id])
    return url + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else "")


def htmx_post(client, url, data):
    return client.post(url, data, HTTP_HX_REQUEST="true")


@pytest.fixture
def paused(make_agent, send, llm):
    """An agent whose last turn stopped on a memory_insert call awaiting approval."""
    agent = make_agent(tool_rules=APPROVAL_RULES)
    llm.push(
        tool_calls(
            tool_call("memory_insert", {"label": "human", "new_string": "Likes tea"}, id="call_tea"),
            reasoning="I should remember this.",
        )
    )
    result = send(agent, "I like tea")
    assert result.stop_reason == "requires_approval"
    return agent


def test_the_workspace_shows_the_history_with_reasoning_tool_calls_and_the_stop_reason(
    owner_client,
    make_agent,
    send,
    llm,
):
    agent = make_agent()
    llm.push(
        tool_calls(
            tool_call("memory_insert", {"label": "human", "new_string": "Name: Ada"}),
            reasoning="The user told me their name.",
        ),
        text("Nice to meet you, Ada!"),
    )
    result = send(agent, "Hi, I am Ada")

    page = owner_client.get(reverse("ade:workspace", args=[agent.id])).content.decode()

    assert "Hi, I am Ada" in page
    assert "The user told me their name." in page
    assert "memory_insert" in page
    assert escape('"new_string": "Name: Ada"') in page  # arguments as indented JSON
    assert "Tool return" in page
    assert 'class="badge ok">success' in page
    assert "Nice to meet you, Ada!" in page
    assert "Turn ended" in page
    assert reverse("ade:run-detail", args=[result.run.id]) in page
    assert f"{result.usage.prompt_tokens + result.usage.completion_tokens} tokens" in page


def test_sending_creates_a_streaming_run_and_answers_a_live_turn_with_its_id(
    owner_client,
    make_agent,
    django_capture_on_commit_callbacks,
):
    agent = make_agent()

    with django_capture_on_commit_callbacks() as submitted:
        response = htmx_post(
            owner_client,
            reverse("ade:conversation-send", args=[agent.id]),
            {"text": "What's up?", "role": "user"},
        )

    run = Run.all_objects.get(agent=agent)
    body = response.content.decode()
    assert response.status_code == 200
    assert f'data-run-id="{run.id}"' in body
    assert "data-live" in body
    assert "What&#x27;s up?" in body
    assert reverse("ade:conversation-cancel", args=[agent.id, run.id]) in body
    assert run.request_config["stream_tokens"] is True
    assert len(submitted) == 1  # handed to the workers once committed
    assert Message.all_objects.get(run=run).role == "user"


def test_a_system_event_is_sent_as_a_system_message(owner_client, make_agent):
    agent = make_agent()

    response = htmx_post(
        owner_client,
        reverse("ade:conversation-send", args=[agent.id]),
        {"text": "The user's calendar changed.", "role": "system"},
    )

    message = Message.all_objects.exclude(THREAD_SYSTEM_MESSAGE).get(agent=agent)
    assert message.role == "system"
    assert message.text == "The user's calendar changed."
    assert "System event" in response.content.decode()


def test_an_empty_message_is_refused_with_a_notice(owner_client, make_agent):
    agent = make_agent()

    response = htmx_post(owner_client, reverse("ade:conversation-send", args=[agent.id]), {"text": "   "})

    assert response.status_code == 422
    assert response["HX-Retarget"] == "#composer-notice"
    assert "Write a message first." in response.content.decode()
    assert not Run.all_objects.filter(agent=agent).exists()


def test_a_pending_approval_shows_a_card_with_the_call_and_the_decision_form(owner_client, paused):
    body = owner_client.get(column_url(paused)).content.decode()

    assert "Approval needed" in body
    assert 'data-testid="approval-form"' in body
    assert escape('"new_string": "Likes tea"') in body
    assert "Waiting for approval" in body
    assert 'data-role="approval-hint">A tool call awaits your decision.' in body  # shown, not hidden


def test_approving_creates_a_run_carrying_the_approval_and_answers_its_live_turn(owner_client, paused):
    request = Message.all_objects.get(agent=paused, role="approval")

    response = htmx_post(
        owner_client,
        reverse("ade:conversation-approve", args=[paused.id]),
        {"request_id": request.id, "decision": "approve", "reason": "ignored when approving"},
    )

    decision = Message.all_objects.get(agent=paused, role="approval", approvals__isnull=False)
    assert decision.approvals == [
        {"type": "approval", "tool_call_id": "call_tea", "approve": True, "reason": None}
    ]
    assert decision.run.request_config["stream_tokens"] is True
    body = response.content.decode()
    assert f'data-run-id="{decision.run_id}"' in body
    assert "Approved" in body
    assert "memory_insert" in body
    assert 'hx-swap-oob="outerHTML"' in body
    assert "Decision sent." in body


def test_denying_sends_the_reason(owner_client, paused):
    request = Message.all_objects.get(agent=paused, role="approval")

    response = htmx_post(
        owner_client,
        reverse("ade:conversation-approve", args=[paused.id]),
        {"request_id": request.id, "decision": "deny", "reason": "Not now"},
    )

    decision = Message.all_objects.get(agent=paused, role="approval", approvals__isnull=False)
    assert decision.approvals[0]["approve"] is False
    assert decision.approvals[0]["reason"] == "Not now"
    assert "Denied" in response.content.decode()
    assert "Not now" in response.content.decode()


def test_a_decision_for_a_request_no_longer_pending_is_refused(owner_client, paused):
    response = htmx_post(
        owner_client,
        reverse("ade:conversation-approve", args=[paused.id]),
        {"request_id": "message-stale", "decision": "approve"},
    )

    assert response.status_code == 409
    assert "already decided" in response.content.decode()


def test_a_new_message_while_an_approval_is_pending_says_what_to_do(owner_client, paused):
    response = htmx_post(owner_client, reverse("ade:conversation-send", args=[paused.id]), {"text": "hello?"})

    assert response.status_code == 409
    assert response["HX-Retarget"] == "#composer-notice"
    assert "waiting for your approval" in response.content.decode()
    assert not Message.all_objects.filter(agent=paused, text="hello?").exists()


def test_switching_conversation_shows_only_its_messages_and_keeps_it_in_the_address(
    owner_client,
    make_agent,
    send,
    llm,
    actor,
):
    agent = make_agent()
    llm.push(text("default answer"), text("thread answer"))
    send(agent, "in the default thread")
    thread = conversation_create(actor=actor, agent_id=agent.id, summary="Trip planning")
    send(agent, "in the trip thread", conversation_id=thread.id)

    response = owner_client.get(column_url(agent, conversation=thread.id), HTTP_HX_REQUEST="true")
    body = response.content.decode()

    assert "thread answer" in body
    assert "default answer" not in body
    assert response["HX-Push-Url"] == reverse("ade:workspace", args=[agent.id]) + f"?conversation={thread.id}"
    assert f'value="{thread.id}" selected' in body
    assert f'name="conversation" value="{thread.id}"' in body  # the send box posts into this thread
    default = owner_client.get(reverse("ade:workspace", args=[agent.id])).content.decode()
    assert "default answer" in default
    assert "thread answer" not in default
    page = owner_client.get(reverse("ade:workspace", args=[agent.id]) + f"?conversation={thread.id}")
    assert "thread answer" in page.content.decode()


def test_sending_into_a_conversation_runs_there(owner_client, make_agent, actor):
    agent = make_agent()
    thread = conversation_create(actor=actor, agent_id=agent.id)

    htmx_post(
        owner_client,
        reverse("ade:conversation-send", args=[agent.id]),
        {"text": "hi", "conversation": thread.id},
    )

    assert Run.all_objects.get(agent=agent).conversation_id == thread.id


def test_new_conversation_creates_one_and_switches_to_it(owner_client, make_agent):
    agent = make_agent()

    response = htmx_post(owner_client, reverse("ade:conversation-new", args=[agent.id]), {})

    thread = agent.conversations.get()
    assert response["HX-Push-Url"].endswith(f"?conversation={thread.id}")
    assert "No messages yet" in response.content.decode()


def test_cancel_stops_an_active_run(owner_client, make_agent, actor):
    agent = make_agent()
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="long task")])

    response = htmx_post(owner_client, reverse("ade:conversation-cancel", args=[agent.id, run.id]), {})

    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    assert "Cancelling" in response.content.decode()
    turn = owner_client.get(reverse("ade:conversation-turn", args=[agent.id, run.id])).content.decode()
    assert "data-live" not in turn
    assert "Cancelled" in turn


def test_an_active_run_renders_as_a_live_turn_with_only_its_input(owner_client, make_agent, actor):
    agent = make_agent()
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="still going")])

    body = owner_client.get(column_url(agent)).content.decode()

    assert f'data-run-id="{run.id}"' in body
    assert 'data-live="1"' in body
    assert "still going" in body
    assert 'data-testid="cancel"' in body


def test_older_messages_load_on_demand_without_repeating(
    owner_client,
    make_agent,
    send,
    llm,
    monkeypatch,
):
    from apps.ade.views import conversation

    monkeypatch.setattr(conversation, "HISTORY_PAGE_SIZE", 4)
    agent = make_agent()
    for i in range(4):
        llm.push(text(f"answer {i}"))
        send(agent, f"question {i}")

    first = owner_client.get(column_url(agent)).content.decode()
    assert "question 2" in first
    assert "answer 3" in first
    assert "question 1" not in first
    assert 'data-testid="load-earlier"' in first
    oldest = Message.all_objects.get(agent=agent, text="question 2")

    earlier = owner_client.get(
        reverse("ade:conversation-earlier", args=[agent.id]) + f"?before={oldest.id}"
    ).content.decode()

    assert "question 0" in earlier
    assert "answer 1" in earlier
    assert "question 2" not in earlier
    assert earlier.count('data-testid="stop-reason"') == 2


def test_another_organisations_agent_run_and_conversation_are_not_found(
    owner_client,
    other_org,
    other_org_actor,
    make_agent,
    actor,
):
    theirs = AgentFactory(organization=other_org)
    their_run = run_create(actor=other_org_actor, agent_id=theirs.id, messages=[MessageIn(content="x")])
    their_thread = conversation_create(actor=other_org_actor, agent_id=theirs.id)
    mine = make_agent()
    my_run = run_create(actor=actor, agent_id=mine.id, messages=[MessageIn(content="y")])
    other_mine = make_agent(name="Other")

    urls = [
        ("get", column_url(theirs)),
        ("get", column_url(mine, conversation=their_thread.id)),
        ("get", reverse("ade:workspace", args=[mine.id]) + f"?conversation={their_thread.id}"),
        ("post", reverse("ade:conversation-send", args=[theirs.id])),
        ("post", reverse("ade:conversation-approve", args=[theirs.id])),
        ("post", reverse("ade:conversation-new", args=[theirs.id])),
        ("get", reverse("ade:conversation-turn", args=[theirs.id, their_run.id])),
        ("get", reverse("ade:conversation-turn", args=[mine.id, their_run.id])),
        ("get", reverse("ade:conversation-turn", args=[other_mine.id, my_run.id])),
        ("post", reverse("ade:conversation-cancel", args=[mine.id, their_run.id])),
    ]
    for method, url in urls:
        response = getattr(owner_client, method)(url, {"text": "hi", "conversation": their_thread.id})
        assert response.status_code == 404, url
    their_run.refresh_from_db()
    assert their_run.status == Run.Status.CREATED
    assert not Message.all_objects.filter(agent=theirs, text="hi").exists()


def test_a_member_can_converse(client, org, make_user, make_agent):
    agent = make_agent()
    member = make_user(org, role=Role.MEMBER)
    client.force_login(member)

    response = htmx_post(
        client, reverse("ade:conversation-send", args=[agent.id]), {"text": "hi from a member"}
    )

    assert response.status_code == 200
    run = Run.all_objects.get(agent=agent)
    assert run.created_by_id == member.id
    assert (
        htmx_post(client, reverse("ade:conversation-cancel", args=[agent.id, run.id]), {}).status_code == 200
    )


def test_the_history_costs_the_same_queries_however_many_turns_it_shows(owner_client, make_agent, send, llm):
    agent = make_agent()

    def queries_for_column() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert owner_client.get(column_url(agent)).status_code == 200
        return len(captured)

    llm.push(text("one"))
    send(agent, "first")
    with_one_turn = queries_for_column()
    for i in range(4):
        llm.push(text(f"more {i}"))
        send(agent, f"again {i}")

    assert queries_for_column() == with_one_turn


@pytest.fixture
def paused_twice(make_agent, send, llm):
    """An agent whose turn stopped on two parallel memory_insert calls awaiting approval."""
    agent = make_agent(tool_rules=APPROVAL_RULES)
    llm.push(
        tool_calls(
            tool_call("memory_insert", {"label": "human", "new_string": "Likes tea"}, id="call_tea"),
            tool_call("memory_insert", {"label": "human", "new_string": "Hates rain"}, id="call_rain"),
        )
    )
    result = send(agent, "I like tea and hate rain")
    assert result.stop_reason == "requires_approval"
    return agent


def test_parallel_calls_get_a_decision_each(owner_client, paused_twice):
    body = owner_client.get(column_url(paused_twice)).content.decode()
    assert 'name="decision_call_tea"' in body
    assert 'name="decision_call_rain"' in body
    request = Message.all_objects.get(agent=paused_twice, role="approval", approvals__isnull=True)

    htmx_post(
        owner_client,
        reverse("ade:conversation-approve", args=[paused_twice.id]),
        {
            "request_id": request.id,
            "decision_call_tea": "approve",
            "decision_call_rain": "deny",
            "reason_call_rain": "Keep the weather out of it",
        },
    )

    decision = Message.all_objects.get(agent=paused_twice, role="approval", approvals__isnull=False)
    assert decision.approvals == [
        {"type": "approval", "tool_call_id": "call_tea", "approve": True, "reason": None},
        {
            "type": "approval",
            "tool_call_id": "call_rain",
            "approve": False,
            "reason": "Keep the weather out of it",
        },
    ]


def test_a_call_left_undecided_is_refused_and_nothing_is_sent(owner_client, paused_twice):
    request = Message.all_objects.get(agent=paused_twice, role="approval", approvals__isnull=True)

    response = htmx_post(
        owner_client,
        reverse("ade:conversation-approve", args=[paused_twice.id]),
        {"request_id": request.id, "decision_call_tea": "approve"},
    )

    assert response.status_code == 422
    assert "every tool call" in response.content.decode()
    assert not Message.all_objects.filter(
        agent=paused_twice, role="approval", approvals__isnull=False
    ).exists()


def test_a_turn_whose_run_ends_while_it_is_rendered_shows_what_the_run_produced(
    actor, make_agent, llm, monkeypatch
):
    """The send's rendering reads the run's messages, then its status: a worker that ends the run in
    between must not leave an ended turn without its answer (the page would not follow the stream)."""
    from apps.ade.views import conversation as views
    from apps.agents.loop import runner
    from apps.agents.services import MessageIn, run_create

    agent = make_agent()
    llm.push(text("Here is my answer."))
    run = run_create(actor=actor, agent_id=agent.id, messages=[MessageIn(content="hi")])
    real = views.run_message_list
    reads = []

    class ReadThenEnd:
        """The messages as read while the run is still `created`; the run then ends at once."""

        def __init__(self, *args, **kwargs):
            self.qs = real(*args, **kwargs)

        def order_by(self, *fields):
            rows = list(self.qs.order_by(*fields))
            reads.append(len(rows))
            if len(reads) == 1:
                runner.execute_run(run.id)
            return rows

    monkeypatch.setattr(views, "run_message_list", ReadThenEnd)

    turn = views.turn_for_run(actor=actor, run=Run.all_objects.get(id=run.id), agent=agent)

    assert not turn.live
    assert "Here is my answer." in str(turn.events)
