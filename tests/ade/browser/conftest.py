"""Browser tests of the ADE: Playwright drives Debian's headless Chromium against the real platform
(daphne serving HTTP and WebSockets, a real Celery worker, the scripted LLM), all on the test database.

Tests here need committed data, so they are `django_db(transaction=True)`; use the `ade` fixture
(an owner signed in, with a page) and `screenshot(page, name)` for the artifacts.
Screenshots land in test-artifacts/screenshots/ (ADE_ARTIFACTS_DIR overrides it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from apps.accounts.models import Organization, User
from apps.core.actor import Actor, Role
from tests.factories import MembershipFactory, OrganizationFactory, UserFactory
from tests.support.ade_server import CHROMIUM_ARGS, AdeServer, chromium_path
from tests.support.scripted_llm import ScriptedLLMServer
from tests.support.workers import ROOT, WorkerProcess, worker_env

if TYPE_CHECKING:
    from playwright.sync_api import Page

PASSWORD = "pw-for-tests-1"
ARTIFACTS = Path(os.environ.get("ADE_ARTIFACTS_DIR") or ROOT / "test-artifacts" / "screenshots")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.django_db(transaction=True))


@pytest.fixture(scope="session")
def chromium() -> str:
    path = chromium_path()
    if path is None:
        message = "Debian's chromium is not installed (apt-get install chromium); .ci/run installs it"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def ade_server(
    django_db_setup, scripted_server: ScriptedLLMServer, celery_worker: WorkerProcess, tmp_path_factory
) -> Iterator[AdeServer]:
    """daphne on the test database; the session's Celery worker executes the runs it submits."""
    # The web process as `make run` starts it: client-side binding (only workers prepare statements).
    env = worker_env(scripted_server.url, DATABASE_SERVER_SIDE_BINDING="false")
    server = AdeServer(env, Path(tmp_path_factory.mktemp("daphne"))).wait_ready()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[object]:
    """Chromium for one test module. Playwright's sync API keeps an event loop running on this thread
    while it is started, so Django's async-safety check is lifted for just that long: the ORM calls
    that tests and fixtures make between browser steps are still plain synchronous code."""
    from playwright.sync_api import sync_playwright

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
            yield browser
            browser.close()


@pytest.fixture(autouse=True)
def _fast_password_hashing() -> None:
    """Overrides the suite's MD5 hasher: the server process checks passwords with the real settings."""


@dataclass
class Ade:
    """A signed-in owner: their organisation, user, Actor, and a Playwright page on the ADE."""

    server: AdeServer
    org: Organization
    user: User
    actor: Actor
    page: Page
    console: list[str] = field(default_factory=list)  # the page's console messages and sockets opened

    def url(self, path: str) -> str:
        return self.server.url + path


def sign_in(page: object, server: AdeServer, username: str, password: str = PASSWORD) -> None:
    page.goto(server.url + "/login/")  # type: ignore[attr-defined]
    page.fill("input[name=username]", username)  # type: ignore[attr-defined]
    page.fill("input[name=password]", password)  # type: ignore[attr-defined]
    page.click("button[type=submit]")  # type: ignore[attr-defined]
    page.wait_for_url(lambda url: "/login" not in url)  # type: ignore[attr-defined]


def htmx_settled(page: object) -> None:
    """Wait until htmx has finished its requests and swaps and has bound the new content. A swapped-in
    control is only live after htmx processed it, and Playwright can be faster than that."""
    page.wait_for_function(  # type: ignore[attr-defined]
        "() => window.htmx && !document.querySelector('.htmx-request, .htmx-swapping, .htmx-settling')"
    )


@pytest.fixture
def new_page(browser: object, ade_server: AdeServer) -> Iterator[Callable[[], object]]:
    """Pages in fresh browser contexts (separate cookies), laptop-sized; closed after the test."""
    contexts: list[object] = []

    def make(width: int = 1440, height: int = 900) -> object:
        context = browser.new_context(viewport={"width": width, "height": height}, base_url=ade_server.url)  # type: ignore[attr-defined]
        context.set_default_timeout(15_000)
        contexts.append(context)
        return context.new_page()

    yield make
    for context in contexts:
        context.close()  # type: ignore[attr-defined]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed ADE test's report carries what the page and the runs were at that moment (a race seen once
    in CI is otherwise a screenshot nobody has)."""
    report: pytest.TestReport = yield
    ade = getattr(item, "funcargs", {}).get("ade")
    if report.when == "call" and report.failed and isinstance(ade, Ade):
        report.sections.append(("ADE state at the failure", _failure_state(ade)))
    return report


def _failure_state(ade: Ade) -> str:
    from apps.agents.models import Run

    lines = ["runs of the test's organisation, oldest first:"]
    lines += [
        f"  {run.id} {run.status} {run.stop_reason} created {run.created_at:%H:%M:%S.%f} "
        f"started {run.started_at} ended {run.completed_at} {run.error or ''}"
        for run in Run.all_objects.filter(organization=ade.org).order_by("created_at")
    ]
    lines += ["the page's console and sockets:", *(f"  {line}" for line in ade.console[-40:])]
    try:
        lines += ["#timeline:", ade.page.locator("#timeline").inner_html(timeout=2_000)[-8_000:]]
    except Exception as exc:  # the page may be what failed
        lines.append(f"#timeline unreadable: {type(exc).__name__}")
    return "\n".join(lines)


@pytest.fixture
def ade(ade_server: AdeServer, new_page: Callable[[], Page], llm) -> Ade:
    """An owner of a fresh organisation, signed in through the login form."""
    org = OrganizationFactory()
    user = MembershipFactory(organization=org, role=Role.OWNER, user=UserFactory(password=PASSWORD)).user
    page = new_page()
    console: list[str] = []
    page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
    page.on("websocket", lambda socket: console.append(f"websocket {socket.url}"))
    sign_in(page, ade_server, user.username)
    actor = Actor(organization_id=org.id, user_id=user.id, role=Role.OWNER)
    return Ade(ade_server, org, user, actor, page, console)


@pytest.fixture
def screenshot() -> Callable[[object, str], Path]:
    def take(page: object, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)  # type: ignore[attr-defined]
        return path

    return take
