"""The platform on several hosts (issue 24): two web hosts, two worker hosts, PostgreSQL and Redis on a host
of their own, beat on another (tests/cluster/harness.py has the topology). While background agents get
messages through both web hosts (tests/cluster/clients.py, Traffic), each test injects one fault and
checks what must hold after any fault (clients.check_invariants): every run ends, every accepted user
message is stored exactly once, no conversation ran two turns at once, no memory edit of a completed run is
lost or applied twice.

Bounds, with the cluster's DATABASE_TCP_TIMEOUT (T = 6 s) and RUN_RECOVERY_INTERVAL (R = 2 s):
- a worker host lost mid-run (power off, or cut off from PostgreSQL and Redis): PostgreSQL ends its session,
  and so releases the conversation's lock, within T; recovery fails the run within R more. Asserted:
  lock free within T + 3 s, run ended within T + 2R + 3 s of the fault.
- PostgreSQL or Redis restarted: every run in flight ends within the restart's duration + 2R + 5 s; a run
  failed by a PostgreSQL restart says so (recovery.DATABASE_RESTARTED); both worker hosts consume again.
- a web host restarted: SSE clients resume from their cursor on the other web host at once; one that
  vanishes silently (link down: no FIN, no RST), within the clients' read timeout (30 s) + 5 s. ADE
  WebSocket clients (killed or SIGTERM: close 4503) reconnect from their cursor to the other web host
  after the page's retry delay, and get every event exactly once.
- a run whose task is lost before any worker took it (removed from the queue, scenario 5) is enqueued
  again by recovery once its task marker has expired, and completes: within RUN_TASK_MARKER_TTL
  (TTL = 12 s here; 120 s by default) + 2R + 5 s of its send. (RUN_LOST_TASK_GRACE, 2 s here, is below
  the TTL, so the TTL is what counts.)

The lost-task bound is why the other scenarios keep runs away from a fault's instant: a task is lost
that a worker had taken but not started when its host died, the one Redis hands a worker that went silent
within the last second (kombu's BRPOP waits 1 s, and Redis answers it to a dead peer), one that could not
be sent while Redis was down, and one whose claim met PostgreSQL down. Such runs end within the bound
above, not within the fault's. So `Traffic.quiet()` holds new sends while a fault is injected (and
SILENT_DEATH_WINDOW after a host goes silent) until no run waits for its worker; runs already executing
are not held, nor are sends that meet a fault (a web host down, the database away: they are resent with
the same otid).

A Redis restart makes a worker that holds unacknowledged tasks exit ("Unrecoverable error" in kombu's
restore of them on the lost connection): its host's service manager starts it again, as a container's
restart policy would; the terminal summary lists such restarts.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from datetime import datetime
from typing import Any, cast

import pytest
import redis

from apps.agents.locks import conversation_lock_key
from apps.agents.recovery import WORKER_LOST, requeue_count_key
from apps.streams.events import END_EVENT, stream_key
from tests.cluster.clients import (
    Api,
    RunRow,
    Sent,
    SseReader,
    Traffic,
    WsFollower,
    check_invariants,
    fact_of,
    memory_turns,
    runs,
    shared_block_value,
    unfinished_runs,
    wait_until,
)
from tests.cluster.harness import RECOVERY_INTERVAL, TASK_MARKER_TTL, TCP_TIMEOUT, WORKERS, Cluster
from tests.support.scripted_llm import ScriptedLLMServer, text

LOCK_BOUND = TCP_TIMEOUT + 3.0
LOST_RUN_BOUND = TCP_TIMEOUT + 2 * RECOVERY_INTERVAL + 3.0
RESTART_SLACK = 2 * RECOVERY_INTERVAL + 5.0
LOST_TASK_BOUND = TASK_MARKER_TTL + 2 * RECOVERY_INTERVAL + 5.0
SILENT_DEATH_WINDOW = 2.0
"""How long new sends are held after a worker host goes silent: Redis hands the next task to the BRPOP
the silent worker left pending for up to 1 s (kombu's brpop_timeout), and that task is gone with it."""


@pytest.fixture
def llm(cluster: Cluster) -> ScriptedLLMServer:
    assert cluster.llm is not None
    return cluster.llm


@pytest.fixture
def traffic(healthy: Cluster, api: Api, llm: ScriptedLLMServer, background_agents: list[str]) -> Traffic:
    """Background messages through both web hosts for the whole test (stopped, and checked, by the test)."""
    running = Traffic(api, llm, background_agents, healthy.tag).start()
    wait_until(lambda: sum(1 for s in running.sent if s.status) >= 3, 60, "background traffic flows")
    return running


def chat_requests_for(llm: ScriptedLLMServer, token: str) -> list[dict[str, Any]]:
    """The chat requests of the scripted LLM whose last user message contains `token`, oldest first."""
    with llm.state.lock:
        log = list(llm.state.log)
    found = []
    for entry in log:
        body = entry.get("body")
        if not entry["path"].startswith("/v1/chat/completions") or not isinstance(body, dict):
            continue
        users = [m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "user"]
        if users and token in str(users[-1].get("content")):
            found.append(entry)
    return found


def wait_for_llm_call(
    llm: ScriptedLLMServer, token: str, count: int = 1, timeout: float = 30
) -> dict[str, Any]:
    """The `count`-th chat request for `token`, once it has arrived (the run is then inside that call)."""
    calls = wait_until(
        lambda: len(found := chat_requests_for(llm, token)) >= count and found,
        timeout,
        f"LLM call {count} of {token}",
    )
    return dict(calls[count - 1])


def worker_of(cluster: Cluster, llm: ScriptedLLMServer, token: str) -> str:
    """The worker host that made the (first) LLM call for `token`."""
    return cluster.host_at(chat_requests_for(llm, token)[0]["client"]).name


def other_worker(name: str) -> str:
    return next(worker for worker in WORKERS if worker != name)


def send(api: Api, agent_id: str, token: str, *, web: str, memory: bool = False) -> Sent:
    sent = Sent(agent_id, token, str(uuid.uuid4()), memory=memory, sent_at=time.time())
    sent.run_id = api.send(agent_id, f"Message {token}", sent.otid, web=web)
    return sent


def run_row(cluster: Cluster, run_id: str | None) -> RunRow:
    [row] = runs(cluster, "id = %s", [run_id])
    return row


def ended_after(row: RunRow, since: float) -> float:
    """Seconds from `since` (time.time()) to the run's end."""
    assert row.completed_at is not None, f"run {row.id} has not ended"
    return row.completed_at - since


def assert_ended_within(cluster: Cluster, run_ids: list[str], since: float, bound: float) -> float:
    """Every run of `run_ids` ends within `bound` seconds of `since` (waited for); returns the longest it
    took."""
    if not run_ids:
        return 0.0

    def ended() -> list[Any]:
        rows = runs(cluster, "id = ANY(%s)", [run_ids])
        return rows if all(r.completed_at is not None for r in rows) else []

    try:
        rows = wait_until(ended, max(0.0, since + bound - time.time()) + 1.0, "runs in flight end", poll=0.2)
    except AssertionError:
        rows = runs(cluster, "id = ANY(%s)", [run_ids])
    late = {
        r.id: (r.status, r.completed_at and round(r.completed_at - since, 2))
        for r in rows
        if r.completed_at is None or r.completed_at - since > bound
    }
    assert not late, f"runs that did not end within {bound:.0f} s of the fault: {late}"
    return max(r.completed_at - since for r in rows)


def finish(cluster: Cluster, traffic: Traffic, block_id: str, *own: Sent) -> None:
    sent = traffic.stop()
    check_invariants(cluster, [*sent, *own], block_id)


# --- 1. a worker host dies ---------------------------------------------------------------------------------


def test_a_worker_host_that_dies_mid_run_loses_that_run_only_and_the_other_worker_takes_the_next(
    healthy: Cluster, api: Api, llm: ScriptedLLMServer, traffic: Traffic, shared_block: str
) -> None:
    cluster = healthy
    agent = api.create_agent("dies-mid-run", block_ids=[shared_block])
    llm.state.push(memory_turns("kill-first", fact_of("kill-first"), reply_latency=60))
    first = send(api, agent, "kill-first", web="web1", memory=True)
    wait_for_llm_call(llm, "kill-first", count=2)  # the memory edit is stored; the reply is awaited
    victim = worker_of(cluster, llm, "kill-first")

    with traffic.quiet(hold_after=SILENT_DEATH_WINDOW):
        in_flight = unfinished_runs(cluster)
        lost_at = time.time()
        cluster.power_off(victim)
    ended = api.wait_run(str(first.run_id), LOST_RUN_BOUND + 5, web="web2")
    row = run_row(cluster, first.run_id)
    took = ended_after(row, lost_at)
    llm.state.push([text("Back again.", when_last_user_contains="kill-second")])
    second = send(api, agent, "kill-second", web="web2")
    after = api.wait_run(str(second.run_id), 30, web="web1")
    longest = assert_ended_within(cluster, in_flight, lost_at, LOST_RUN_BOUND)
    cluster.power_on(victim)

    cluster.record("1. worker host dies", "its run failed by recovery", took, LOST_RUN_BOUND)
    cluster.record(
        "1. worker host dies", f"all {len(in_flight)} runs in flight ended", longest, LOST_RUN_BOUND
    )
    assert (ended["status"], row.stop_reason, row.error) == ("failed", "error", {"message": WORKER_LOST})
    assert took <= LOST_RUN_BOUND
    assert after["status"] == "completed"
    assert worker_of(cluster, llm, "kill-second") == other_worker(victim)
    kept_edit = shared_block_value(cluster, shared_block).count(fact_of("kill-first"))
    assert kept_edit == 1  # the run's first step (the memory edit) was stored before the host died
    finish(cluster, traffic, shared_block, first, second)


# --- 2. a worker host is cut off from PostgreSQL and Redis -----------------------------------------------


def test_a_worker_cut_off_mid_run_releases_the_conversation_and_writes_nothing_when_it_comes_back(
    healthy: Cluster, api: Api, llm: ScriptedLLMServer, traffic: Traffic, shared_block: str
) -> None:
    cluster = healthy
    agent = api.create_agent("cut-off", block_ids=[shared_block])
    key = conversation_lock_key(agent, None)
    # The model answers the cut-off worker only after the partition has healed: it then goes on with the
    # run (a memory edit, the step), which by then is failed and the conversation's next run done elsewhere.
    answer_after = TCP_TIMEOUT + 2 * RECOVERY_INTERVAL + 12.0
    llm.state.push(memory_turns("cut-first", fact_of("cut-first"), latency=answer_after))
    first = send(api, agent, "cut-first", web="web2", memory=True)
    call = wait_for_llm_call(llm, "cut-first")
    victim = worker_of(cluster, llm, "cut-first")
    holder_before = cluster.advisory_lock_holder(key)

    with traffic.quiet(hold_after=SILENT_DEATH_WINDOW):
        in_flight = unfinished_runs(cluster)
        cut_at = time.time()
        cluster.partition(victim)
    wait_until(
        lambda: cluster.advisory_lock_holder(key) is None,
        LOCK_BOUND + 5,
        "the conversation's lock is freed",
        poll=0.2,
    )
    lock_freed = time.time() - cut_at
    ended = api.wait_run(str(first.run_id), LOST_RUN_BOUND + 5, web="web1")
    row = run_row(cluster, first.run_id)
    llm.state.push([text("Still here.", when_last_user_contains="cut-second")])
    second = send(api, agent, "cut-second", web="web1")
    after = api.wait_run(str(second.run_id), 30, web="web2")
    longest = assert_ended_within(cluster, in_flight, cut_at, LOST_RUN_BOUND)
    replay_before = stream_kinds(api, str(first.run_id))
    healed_at = time.time()
    cluster.heal(victim)
    assert healed_at < call["time"] + answer_after, "healed too late: the model answered during the partition"
    # The model answers the cut-off worker now; give it time to try everything it would do next.
    time.sleep(max(0.0, call["time"] + answer_after + TCP_TIMEOUT + 2 - time.time()))
    wait_until(lambda: cluster.worker_answers(victim), 30, f"{victim} is back on the broker")

    cluster.record("2. worker cut off", "conversation lock released", lock_freed, LOCK_BOUND)
    cluster.record(
        "2. worker cut off", "its run failed by recovery", ended_after(row, cut_at), LOST_RUN_BOUND
    )
    cluster.record("2. worker cut off", f"all {len(in_flight)} runs in flight ended", longest, LOST_RUN_BOUND)
    assert holder_before == cluster.hosts[victim].address
    assert lock_freed <= LOCK_BOUND
    assert (ended["status"], row.error) == ("failed", {"message": WORKER_LOST})
    assert ended_after(row, cut_at) <= LOST_RUN_BOUND
    assert after["status"] == "completed"
    assert worker_of(cluster, llm, "cut-second") == other_worker(victim)
    # Fencing: the worker that came back stored nothing of the run it had lost.
    assert cluster.query("SELECT count(*) FROM agents_step WHERE run_id = %s", [first.run_id]) == [(0,)]
    assert cluster.query(
        "SELECT role FROM agents_message WHERE run_id = %s ORDER BY sequence_id", [first.run_id]
    ) == [("user",)]
    assert fact_of("cut-first") not in shared_block_value(cluster, shared_block)
    assert run_row(cluster, first.run_id) == row  # still failed, as recovery left it
    assert stream_kinds(api, str(first.run_id)) == replay_before  # what clients read is unchanged
    # Stream fencing: recovery's end made it the stream's newest writer, so the worker appended nothing.
    assert events_after_the_end(cluster, str(first.run_id)) == []
    finish(cluster, traffic, shared_block, first, second)


def stream_kinds(api: Api, run_id: str) -> list[str]:
    """What a client attaching to the run's stream now reads: the message types, then "[DONE]"."""
    response = api.call("GET", f"/v1/runs/{run_id}/stream", web="web1", timeout=30)
    data = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    return [item if item == "[DONE]" else str(json.loads(item).get("message_type")) for item in data]


def events_after_the_end(cluster: Cluster, run_id: str) -> list[str]:
    """The message types in the run's Redis stream after its first end event (which every reader stops at:
    the SSE endpoints, blocking sends and the ADE's relay)."""
    client = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
    entries = cast("list[tuple[str, dict[str, str]]]", client.xrange(stream_key(run_id)))
    kinds = [json.loads(fields["data"]).get("message_type") for _, fields in entries]
    client.close()
    return [str(kind) for kind in kinds[kinds.index(END_EVENT) + 1 :]] if END_EVENT in kinds else []


# --- 3. Redis and PostgreSQL restart -----------------------------------------------------------------------


@pytest.mark.parametrize("service", ["redis", "postgres"])
def test_runs_in_flight_end_and_later_messages_work_after_a_restart_of(
    service: str, healthy: Cluster, api: Api, llm: ScriptedLLMServer, traffic: Traffic, shared_block: str
) -> None:
    cluster = healthy
    agent = api.create_agent(f"{service}-restart", block_ids=[shared_block])
    token = f"{service}-first"
    llm.state.push(memory_turns(token, fact_of(token), reply_latency=3.0))
    first = send(api, agent, token, web="web1", memory=True)
    wait_for_llm_call(llm, token, count=2)

    with traffic.quiet():
        in_flight = unfinished_runs(cluster)
        restarted_at = time.time()
        away = cluster.restart_redis() if service == "redis" else cluster.restart_postgres()
    bound = away + RESTART_SLACK
    ended = api.wait_run(str(first.run_id), bound + 10, web="web2")
    longest = assert_ended_within(cluster, in_flight, restarted_at, bound)
    later = []
    for web in ("web1", "web2"):
        token_later = f"{service}-later-{web}"
        llm.state.push([text("Fine.", when_last_user_contains=token_later)])
        later.append(send(api, agent, token_later, web=web))
        # Queued meanwhile if the workers are starting again (a Redis restart can make them exit).
        assert api.wait_run(str(later[-1].run_id), 90, web=web)["status"] == "completed"
    restored = time.time() - restarted_at
    # Both worker hosts serve again (a Redis restart can make a worker exit: its supervisor restarts it).
    for worker in WORKERS:
        wait_until(functools.partial(cluster.worker_answers, worker), 90, f"{worker} is back on the broker")
    recovered = time.time() - restarted_at

    name = f"3. {'Redis' if service == 'redis' else 'PostgreSQL'} restart"
    cluster.record(name, f"{service} away (kill -9, start on the same data)", away)
    cluster.record(name, f"all {len(in_flight)} runs in flight ended", longest, bound)
    cluster.record(name, "messages through both web hosts complete again", restored)
    cluster.record(name, "both worker hosts consume again", recovered)
    row = run_row(cluster, first.run_id)
    cluster.note(
        name, f"the scenario's run in flight: {row.status}, {(row.error or {}).get('message', '')!r}"
    )
    assert ended["status"] in ("completed", "failed")
    assert ended["status"] == "completed" or (row.error or {}).get("message")
    failed_reasons = {
        message
        for (message,) in cluster.query(
            "SELECT error->>'message' FROM agents_run WHERE id = ANY(%s) AND status = 'failed'", [in_flight]
        )
    }
    if service == "postgres":  # what happened, not a worker that "stopped": the database's restart
        assert WORKER_LOST not in failed_reasons, failed_reasons
        cluster.note(name, f"reasons of the runs it failed: {sorted(failed_reasons)}")
    finish(cluster, traffic, shared_block, first, *later)


# --- 4. a web host restarts while SSE clients stream ------------------------------------------------------


SSE_READ_TIMEOUT = 30.0
"""The SSE clients' read timeout (clients.SseReader): how long a client waits on a silent connection (a
live stream sends a ping at least every few seconds) before it resumes elsewhere."""


@pytest.mark.parametrize("how", ["kill", "sigterm", "vanish"])
def test_sse_clients_resume_from_their_cursor_on_the_other_web_host_when_theirs_restarts(
    how: str, healthy: Cluster, api: Api, llm: ScriptedLLMServer, traffic: Traffic, shared_block: str
) -> None:
    cluster = healthy
    leaving = "web1" if how in ("kill", "vanish") else "web2"
    readers = []
    for index in range(3):
        agent = api.create_agent(f"sse-{how}-{index}", block_ids=[shared_block])
        token = f"sse-{how}-{index}"
        llm.state.push(memory_turns(token, fact_of(token), reply_latency=5.0))
        reader = SseReader(api, agent, f"Message {token}", web=leaving)
        reader.start()
        readers.append(reader)
    for reader in readers:
        wait_until(functools.partial(reader.seen, "tool_return_message"), 30, "the first step streamed")

    restarted_at = time.time()
    if how == "kill":
        cluster.crash(leaving)  # every process, -9; the host itself stays up and closes their connections
        cluster.power_on(leaving)
    elif how == "vanish":
        cluster.power_off(leaving)  # link down first: no FIN, no RST; the clients only hear silence
    else:
        cluster.restart_web(leaving)  # it drains: streams are cut after WEB_SHUTDOWN_TIMEOUT (1 s)
    back = time.time() - restarted_at
    for reader in readers:
        reader.join(timeout=SSE_READ_TIMEOUT + 60)
    if how == "vanish":
        cluster.power_on(leaving)
        back = time.time() - restarted_at
    check = f"sse-{how}-back"
    llm.state.push([text("Back.", when_last_user_contains=check)])
    served = api.wait_run(str(send(api, readers[0].agent_id, check, web=leaving).run_id), 30, web=leaving)

    name = (
        "4. web host "
        + {"kill": "killed", "sigterm": "stopped (SIGTERM)", "vanish": "vanished silently"}[how]
    )
    cuts = [r.cut_at - restarted_at for r in readers if r.cut_at is not None]
    # How late the first message after the resume reached its client, counted from when it was made.
    lags = [
        at - datetime.fromisoformat(item["date"]).timestamp()
        for at, item in (r.first_resumed for r in readers if r.first_resumed)
    ]
    cut_bound = SSE_READ_TIMEOUT + 5.0 if how == "vanish" else None
    cluster.record(name, "SSE clients saw their stream cut (longest)", max(cuts, default=-1.0), cut_bound)
    cluster.record(name, "first message after the resume, delivery lag (longest)", max(lags, default=-1.0))
    cluster.record(name, "web host serving again", back)
    for reader in readers:
        produced = cluster.query(
            "SELECT id FROM agents_message WHERE run_id = %s AND role <> 'user'", [reader.run_id]
        )
        streamed = [m["id"] for m in reader.messages()]
        assert reader.error is None, (reader.error, reader.connections)
        assert [web for web, _ in reader.connections] == [leaving, other_web(leaving)], reader.connections
        assert reader.items[-1] == "[DONE]"
        assert {"message_type": "stop_reason", "stop_reason": "end_turn"} in reader.items
        assert sorted(streamed) == sorted(row[0] for row in produced)  # each message once, none lost
    assert (len(cuts), len(lags)) == (len(readers), len(readers))
    if cut_bound is not None:  # silence is noticed by the client's read timeout, then it resumes at once
        assert max(cuts) <= cut_bound
    assert served["status"] == "completed"
    finish(cluster, traffic, shared_block)


def other_web(web: str) -> str:
    return "web2" if web == "web1" else "web1"


# --- 4b. a web host restarts while ADE pages follow runs over the WebSocket -------------------------------


@pytest.mark.parametrize("how", ["kill", "sigterm"])
def test_ade_websocket_clients_reconnect_from_their_cursor_to_the_other_web_host_when_theirs_restarts(
    how: str, healthy: Cluster, api: Api, llm: ScriptedLLMServer, traffic: Traffic, shared_block: str
) -> None:
    cluster = healthy
    leaving, staying = "web1", "web2"
    session = api.ade_session(staying)
    followers = []
    # The first page reconnects at once and gets the rest live; the second only after the page's longest
    # back-off (5 s), by when its run has ended: what it missed comes from its cursor.
    for index, (reply_latency, retry_delay) in enumerate([(5.0, WsFollower.RETRY_DELAY), (2.0, 5.0)]):
        agent = api.create_agent(f"ws-{how}-{index}", block_ids=[shared_block])
        token = f"ws-{how}-{index}"
        llm.state.push(memory_turns(token, fact_of(token), reply_latency=reply_latency))
        sent = send(api, agent, token, web=leaving)
        follower = WsFollower(api, session, str(sent.run_id), web=leaving, retry_delay=retry_delay)
        follower.start()
        followers.append(follower)
    for follower in followers:
        wait_until(functools.partial(follower.seen, "tool_return_message"), 30, "the first step relayed")

    restarted_at = time.time()
    if how == "kill":
        cluster.crash(leaving)  # every process, -9: the host's kernel closes the sockets (no close frame)
        cluster.power_on(leaving)
    else:
        cluster.restart_web(leaving)  # it drains: WebSockets are closed with 4503 (config/serve.py)
    back = time.time() - restarted_at
    for follower in followers:
        follower.join(timeout=WsFollower.READ_TIMEOUT + 60)

    name = "4b. web host " + {"kill": "killed", "sigterm": "stopped (SIGTERM)"}[how] + " (WS)"
    cuts = [f.cut_at - restarted_at for f in followers if f.cut_at is not None]
    lags = [
        at - datetime.fromisoformat(event["date"]).timestamp()
        for at, event in (f.first_resumed for f in followers if f.first_resumed)
    ]
    cluster.record(name, "ADE WebSockets saw their socket drop (longest)", max(cuts, default=-1.0))
    cluster.record(name, "first event after the reconnect, delivery lag (longest)", max(lags, default=-1.0))
    cluster.record(name, "web host serving again", back)
    cluster.note(name, f"events replayed from the cursor on reconnect: {[f.replayed for f in followers]}")
    for follower in followers:
        assert follower.error is None, (follower.error, follower.connections)
        first, second = follower.connections
        assert first[0] == leaving, follower.connections
        if how == "sigterm":
            assert first[1] == "close 4503", follower.connections  # "server restarting": the ADE reconnects
        else:
            assert first[1].startswith("cut"), follower.connections
        assert second == (staying, "end"), follower.connections
        # Every event of the run's stream exactly once, in order, up to its end: what Redis holds.
        assert [f["cursor"] for f in follower.frames] == stream_ids_to_the_end(cluster, follower.run_id)
        end = follower.events()[-1]
        assert (end["message_type"], end["status"]) == ("run_end", "completed")
        assert {"message_type": "stop_reason", "stop_reason": "end_turn"} in follower.events()
        produced = cluster.query(
            "SELECT id FROM agents_message WHERE run_id = %s AND role <> 'user'", [follower.run_id]
        )
        # Every message the run produced reached the page (the stream's once-only is asserted above).
        relayed = {
            e["id"] for e in follower.events() if e.get("id") and e.get("message_type") != "user_message"
        }
        assert relayed == {row[0] for row in produced}
    assert (len(cuts), len(lags)) == (len(followers), len(followers))
    assert followers[1].replayed > 0  # the late page did get events it had missed, from its cursor
    finish(cluster, traffic, shared_block)


def stream_ids_to_the_end(cluster: Cluster, run_id: str) -> list[str]:
    """The entry ids of the run's Redis stream up to and including its first end event."""
    client = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
    entries = cast("list[tuple[str, dict[str, str]]]", client.xrange(stream_key(run_id)))
    client.close()
    ids = []
    for entry_id, fields in entries:
        ids.append(entry_id)
        if json.loads(fields["data"]).get("message_type") == END_EVENT:
            break
    return ids


# --- 5. a task lost before any worker took it ---------------------------------------------------------------


def test_a_run_whose_task_was_lost_before_any_worker_took_it_is_enqueued_again_and_completes(
    healthy: Cluster, api: Api, llm: ScriptedLLMServer, traffic: Traffic, shared_block: str
) -> None:
    cluster = healthy
    agent = api.create_agent("lost-task", block_ids=[shared_block])
    llm.state.push(memory_turns("lost-task", fact_of("lost-task")))
    with traffic.quiet():
        cluster.pause_consuming()
        try:
            lost = send(api, agent, "lost-task", web="web1", memory=True)
            cluster.lose_task(str(lost.run_id))
        finally:
            cluster.resume_consuming()
    ended = api.wait_run(str(lost.run_id), LOST_TASK_BOUND + 10, web="web2")
    row = run_row(cluster, lost.run_id)
    took = ended_after(row, lost.sent_at)
    waited = (row.started_at or 0.0) - lost.sent_at
    client = redis.Redis.from_url(cluster.redis_url)
    requeues = client.get(requeue_count_key(str(lost.run_id)))
    client.close()

    cluster.record("5. task lost before a claim", "claimed again after the send", waited)
    cluster.record("5. task lost before a claim", "run completed after the send", took, LOST_TASK_BOUND)
    assert ended["status"] == "completed"
    assert took <= LOST_TASK_BOUND
    # Nothing executed it until recovery saw its marker expire, and recovery enqueued it once.
    assert waited >= TASK_MARKER_TTL
    assert requeues == b"1"
    assert shared_block_value(cluster, shared_block).count(fact_of("lost-task")) == 1
    finish(cluster, traffic, shared_block, lost)
