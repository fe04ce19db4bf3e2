from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.accounts.models import Organization, User
from apps.accounts.services import api_key_create
from apps.agents.loop.events import ListSink
from apps.agents.models import Agent
from apps.agents.services import BlockSpec, MessageIn, agent_create, agent_send_message
from apps.core.actor import Actor, Role
from tests.factories import MembershipFactory, OrganizationFactory, UserFactory
from tests.support.mcp_server import stdio_launch
from tests.support.scripted_llm import ScriptedLLM, ScriptedLLMServer
from tests.support.workers import WorkerProcess, worker_env


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _no_accidental_throttling(settings) -> None:
    """Request rates and wrong-key limits no test reaches by accident (the counters live in Redis, shared
    by every test and run); tests of throttling set their own."""
    settings.API_RATE_PER_KEY = settings.API_RATE_PER_ORG = "1000000/min"
    settings.API_KEY_FAILURE_LIMIT = 1_000_000


@pytest.fixture
def org(db) -> Organization:
    return OrganizationFactory(name="Acme")


@pytest.fixture
def other_org(db) -> Organization:
    return OrganizationFactory(name="Globex")


@pytest.fixture
def user(org: Organization) -> User:
    return MembershipFactory(organization=org, role=Role.OWNER, user__username="alice").user


@pytest.fixture
def other_user(other_org: Organization) -> User:
    return MembershipFactory(organization=other_org, role=Role.OWNER, user__username="bob").user


@pytest.fixture
def actor(org: Organization, user: User) -> Actor:
    return Actor(organization_id=org.id, user_id=user.id, role=Role.OWNER)


@pytest.fixture
def other_org_actor(other_org: Organization, other_user: User) -> Actor:
    return Actor(organization_id=other_org.id, user_id=other_user.id, role=Role.OWNER)


@pytest.fixture
def api_client_for(db) -> Callable[[Actor], APIClient]:
    """An APIClient authenticated the way the Letta SDK is: `Authorization: Bearer <key>`."""

    def make(actor: Actor) -> APIClient:
        created = api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="test")
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {created.raw_key}")
        return client

    return make


@pytest.fixture
def make_user() -> Callable[..., User]:
    def make(org: Organization, *, role: Role = Role.MEMBER, **kwargs: object) -> User:
        return MembershipFactory(organization=org, role=role, user=UserFactory(**kwargs)).user

    return make


@pytest.fixture(scope="session")
def scripted_server() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer(strict=True) as server:
        yield server


@pytest.fixture
def llm(scripted_server: ScriptedLLMServer, settings) -> Iterator[ScriptedLLM]:
    """The scripted LLM (tests/support/scripted_llm.py), reset, with the deployment's OpenAI settings pointing at it and fast retries."""
    settings.OPENAI_API_KEY = "sk-test"
    settings.OPENAI_BASE_URL = scripted_server.url
    settings.LLM_MAX_ATTEMPTS = 3
    settings.LLM_RETRY_BASE_DELAY = 0.001
    settings.LLM_RETRY_MAX_DELAY = 0.01
    settings.LLM_REQUEST_TIMEOUT = 10.0
    client = scripted_server.client()
    client.reset(config=True)
    client.configure(strict=True)
    yield client
    client.reset(config=True)


@pytest.fixture(scope="session")
def celery_worker(
    django_db_setup, scripted_server: ScriptedLLMServer, tmp_path_factory
) -> Iterator[WorkerProcess]:
    """A real Celery worker process on the test database, calling the scripted LLM. Tests that use it
    need committed data: mark them `@pytest.mark.django_db(transaction=True)`."""
    log_dir = Path(tmp_path_factory.mktemp("workers"))
    # The test MCP server may run in the worker's jail (registrations it finishes, agents' MCP tools).
    mcp = stdio_launch()
    env = worker_env(
        scripted_server.url,
        MCP_STDIO_COMMANDS=mcp.command,
        MCP_STDIO_READ_PATHS=",".join(mcp.read_paths),
        MCP_LIST_TOOLS_TIMEOUT="8",
    )
    worker = WorkerProcess("worker-a", env, log_dir, concurrency=2).wait_ready()
    yield worker
    worker.stop()


@pytest.fixture(autouse=True)
def _worker_idle_before_the_database_is_flushed(request, _django_db_helper) -> Iterator[None]:
    """A test that used the worker ends only when the worker has no task left: a run it is still
    finishing (a cancelled one writes its end, then its traces) would otherwise hold row locks while
    the transactional test's flush truncates every table, and the two deadlock. Set up after the
    database fixture, so torn down before its flush."""
    yield
    if "celery_worker" in request.fixturenames:
        request.getfixturevalue("celery_worker").wait_idle()
    if "ade_server" in request.fixturenames or "celery_worker" in request.fixturenames:
        _other_sessions_quiet()


OTHER_SESSIONS_QUIET_S = 5.0


def _other_sessions_quiet() -> None:
    """Until no other session of the test database runs a statement or holds a transaction open (at most
    OTHER_SESSIONS_QUIET_S): a page's last request, still in daphne when the test ended, locked a table
    the flush's TRUNCATE needed while waiting for one the TRUNCATE held, and the flush failed on the
    deadlock (seen once in a rehearsal, tests/ade/browser/test_memory.py)."""
    import time

    from django.db import connection

    deadline = time.monotonic() + OTHER_SESSIONS_QUIET_S
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                " AND state IN ('active', 'idle in transaction')"
            )
            (busy,) = cursor.fetchone()
        if not busy:
            return
        time.sleep(0.05)


# --- agents ---------------------------------------------------------------------------------------------


@pytest.fixture
def make_agent(actor: Actor, llm: ScriptedLLM) -> Callable[..., Agent]:
    def make(**kwargs: Any) -> Agent:
        kwargs.setdefault("name", "Assistant")
        kwargs.setdefault("model", "openai/gpt-4o-mini")
        kwargs.setdefault("embedding", "openai/text-embedding-3-small")
        kwargs.setdefault(
            "memory_blocks",
            [
                BlockSpec(label="human", value="Name: unknown", limit=2000),
                BlockSpec(label="persona", value="I am a helpful assistant.", limit=2000),
            ],
        )
        return agent_create(actor=actor, **kwargs)

    return make


@pytest.fixture
def send(actor: Actor) -> Callable[..., Any]:
    """Send as the user and run the turn now; returns (TurnResult, events)."""

    def do(agent: Agent, text: str | None = None, **inputs: Any) -> Any:
        sink = ListSink()
        if text is not None:
            inputs["messages"] = [MessageIn(content=text)]
        result = agent_send_message(actor=actor, agent_id=agent.id, sink=sink, **inputs)
        result.events = sink.events
        return result

    return do


@pytest.fixture
def fast_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """SSE readers poll every 50 ms and give up after 20 s (tests that follow a run's stream)."""
    from apps.api import sse

    monkeypatch.setattr(sse, "POLL_MS", 50)
    monkeypatch.setattr(sse, "FOLLOW_TIMEOUT_S", 20.0)
