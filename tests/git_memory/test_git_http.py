"""Agent memory as a git repository: the real git client over smart HTTP against pytest-django's live
server, and the block changes seen through the official letta-client SDK. Only loopback is contacted."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connections
from letta_client import Letta

from apps.accounts.models import User
from apps.accounts.services import api_key_create
from apps.core.actor import Actor, Role
from apps.memory.models import Block, BlockHistory

pytestmark = pytest.mark.django_db(transaction=True)

TAG = "git-memory-enabled"


@pytest.fixture(autouse=True)
def _no_persistent_connections_in_server_threads() -> Iterator[None]:
    """The live server answers each request in a new thread; persistent connections would outlive it."""
    db_settings = connections.settings["default"]
    saved = db_settings["CONN_MAX_AGE"]
    db_settings["CONN_MAX_AGE"] = 0
    yield
    db_settings["CONN_MAX_AGE"] = saved


@pytest.fixture(autouse=True)
def _refused_openai(settings) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings.OPENAI_API_KEY = "sk-test"
    settings.OPENAI_BASE_URL = f"http://127.0.0.1:{port}/v1"


def key_for(actor: Actor) -> str:
    return api_key_create(actor=actor, user=User.objects.get(id=actor.user_id), name="git").raw_key


def sdk(live_server, key: str) -> Letta:
    return Letta(base_url=live_server.url, api_key=key, max_retries=0, timeout=20)


def make_agent(client: Letta, *, tags: list[str] | None = None, read_only_policy: bool = False):
    blocks: list[Any] = [
        {"label": "human", "value": "Name: Sam", "limit": 200, "description": "About the user"},
        {"label": "persona", "value": "I am helpful.", "limit": 100},
    ]
    if read_only_policy:
        blocks.append({"label": "policy", "value": "Be kind.", "read_only": True})
    return client.agents.create(
        name="Memo", model="openai/gpt-4o-mini", memory_blocks=blocks, tags=[TAG] if tags is None else tags
    )


class Git:
    """The git binary in an isolated HOME (no user or system config, never a prompt)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_AUTHOR_NAME": "Sam Pusher",
            "GIT_AUTHOR_EMAIL": "sam@example.com",
            "GIT_COMMITTER_NAME": "Sam Pusher",
            "GIT_COMMITTER_EMAIL": "sam@example.com",
            "NO_PROXY": "*",
        }

    def run(
        self, *args: str, cwd: Path | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["git", *args], cwd=cwd or self.home, env=self.env, capture_output=True, text=True, timeout=60
        )
        if check and result.returncode != 0:
            raise AssertionError(f"git {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result


@pytest.fixture
def git(tmp_path: Path) -> Git:
    return Git(tmp_path)


def basic_url(live_server, agent_id: str, key: str) -> str:
    host = live_server.url.removeprefix("http://")
    return f"http://git:{key}@{host}/v1/git/{agent_id}/state.git"


def clone(git: Git, live_server, agent_id: str, key: str, name: str = "memory") -> Path:
    git.run("clone", basic_url(live_server, agent_id, key), name)
    return git.home / name


def block_id(client: Letta, agent_id: str, label: str) -> str:
    return next(b.id for b in client.agents.blocks.list(agent_id) if b.label == label)


def commit_all(git: Git, repo: Path, message: str) -> None:
    git.run("add", "-A", cwd=repo)
    git.run("commit", "-q", "-m", message, cwd=repo)


def test_clone_edit_push_changes_the_block(live_server, actor, git):
    key = key_for(actor)
    client = sdk(live_server, key)
    agent = make_agent(client)

    repo = clone(git, live_server, agent.id, key)
    human = repo / "system" / "human.md"
    text = human.read_text()
    human.write_text(text.replace("Name: Sam", "Name: Sam\nLikes tea"))
    commit_all(git, repo, "Remember the tea")
    pushed = git.run("push", "origin", "HEAD:main", cwd=repo)

    block = client.blocks.retrieve(block_id(client, agent.id, "system/human"))
    assert sorted(p.name for p in (repo / "system").iterdir()) == ["human.md", "persona.md"]
    assert text == "---\ndescription: About the user\nlimit: 200\n---\nName: Sam"
    assert block.value == "Name: Sam\nLikes tea"
    assert "HEAD -> main" in pushed.stderr
    entry = BlockHistory.objects.unscoped().filter(block_id=block.id).order_by("-version").first()
    assert (entry.actor_type, entry.actor_id) == ("user", actor.user_id)
    assert (
        git.run("ls-remote", "origin", "main", cwd=repo).stdout.split()[0]
        == git.run("rev-parse", "HEAD", cwd=repo).stdout.strip()
    )


def test_a_second_push_fast_forwards_on_the_pushed_commit(live_server, actor, git):
    key = key_for(actor)
    client = sdk(live_server, key)
    agent = make_agent(client)
    repo = clone(git, live_server, agent.id, key)
    persona = repo / "system" / "persona.md"

    persona.write_text(persona.read_text() + "\nFirst")
    commit_all(git, repo, "first")
    git.run("push", "origin", "HEAD:main", cwd=repo)
    persona.write_text(persona.read_text() + "\nSecond")
    commit_all(git, repo, "second")
    git.run("push", "origin", "HEAD:main", cwd=repo)

    block = client.blocks.retrieve(block_id(client, agent.id, "system/persona"))
    assert block.value == "I am helpful.\nFirst\nSecond"
    log = git.run("log", "--format=%an|%s", "origin/main", cwd=repo).stdout.splitlines()
    assert log[:2] == ["Sam Pusher|second", "Sam Pusher|first"]


def test_clone_with_a_bearer_extra_header(live_server, actor, git):
    key = key_for(actor)
    agent = make_agent(sdk(live_server, key))
    url = f"{live_server.url}/v1/git/{agent.id}/state.git"

    git.run("-c", f"http.extraHeader=Authorization: Bearer {key}", "clone", url, "memory")

    assert sorted(p.name for p in (git.home / "memory" / "system").iterdir()) == ["human.md", "persona.md"]


def test_adding_a_file_creates_a_block_and_removing_one_detaches_it(live_server, actor, git):
    key = key_for(actor)
    client = sdk(live_server, key)
    agent = make_agent(client)
    repo = clone(git, live_server, agent.id, key)
    persona_id = block_id(client, agent.id, "system/persona")

    (repo / "notes").mkdir()
    (repo / "notes" / "todo.md").write_text("---\ndescription: Things to do\nlimit: 500\n---\nBuy milk")
    (repo / "system" / "persona.md").unlink()
    commit_all(git, repo, "todo instead of persona")
    git.run("push", "origin", "HEAD:main", cwd=repo)

    blocks = {b.label: b for b in client.agents.blocks.list(agent.id)}
    assert sorted(blocks) == ["notes/todo", "system/human"]
    assert (blocks["notes/todo"].value, blocks["notes/todo"].limit) == ("Buy milk", 500)
    assert blocks["notes/todo"].description == "Things to do"
    assert client.blocks.retrieve(persona_id).value == "I am helpful."


def _snapshot(agent_id: str) -> list[tuple[str, str, int, str]]:
    return sorted(
        Block.objects.unscoped()
        .filter(agent_attachments__agent_id=agent_id)
        .values_list("label", "value", "version", "description")
    )


def _rejected_push(git: Git, repo: Path) -> str:
    result = git.run("push", "origin", "HEAD:main", cwd=repo, check=False)
    assert result.returncode != 0
    return result.stderr


@pytest.mark.parametrize(
    ("path", "content", "message"),
    [
        (
            "system/human.md",
            "---\ndescription: About the user\nlimit: 200\n---\n" + "x" * 201,
            "system/human.md: value is 201 characters, over the block's limit of 200",
        ),
        (
            "system/policy.md",
            "---\ndescription: ''\nlimit: 100000\nread_only: true\n---\nBe mean.",
            "block 'system/policy' is read-only and cannot be changed by git",
        ),
        (
            "system/human.md",
            "---\ndescription: [unclosed\n---\nName: Sam",
            "system/human.md: front matter is not valid YAML",
        ),
        ("system/human.md", "Name: Sam, no front matter", "system/human.md: front matter missing"),
        (  # an alias bomb: a few lines that serialise to 9^9 strings
            "system/human.md",
            "---\nmetadata:\n  a: &a [x, x, x, x, x, x, x, x, x]\n  b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
            "  c: [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n---\nName: Sam",
            "aliases (*name) are not allowed",
        ),
        (
            "system/human.md",
            "---\nlimit: lots\n---\nName: Sam",
            "system/human.md: front matter 'limit' must be a positive number of characters",
        ),
        ("system/run.sh", "echo hi", "system/run.sh: only .md files (one per memory block) are allowed"),
    ],
)
def test_a_bad_push_is_rejected_and_changes_nothing(live_server, actor, git, path, content, message):
    key = key_for(actor)
    agent = make_agent(sdk(live_server, key), read_only_policy=True)
    repo = clone(git, live_server, agent.id, key)
    before = _snapshot(agent.id)
    head = git.run("ls-remote", "origin", "main", cwd=repo).stdout

    (repo / path).write_text(content)
    (repo / "system" / "persona.md").write_text("---\ndescription: ''\nlimit: 100\n---\nChanged too")
    commit_all(git, repo, "bad")
    stderr = _rejected_push(git, repo)

    assert "[remote rejected]" in stderr
    assert message in stderr
    assert _snapshot(agent.id) == before
    assert git.run("ls-remote", "origin", "main", cwd=repo).stdout == head


def test_a_non_fast_forward_push_is_refused_and_the_other_write_kept(live_server, actor, git):
    key = key_for(actor)
    client = sdk(live_server, key)
    agent = make_agent(client)
    repo = clone(git, live_server, agent.id, key)
    human_id = block_id(client, agent.id, "system/human")

    client.blocks.update(human_id, value="Name: Sam (edited meanwhile)")
    (repo / "system" / "human.md").write_text("---\ndescription: About the user\nlimit: 200\n---\nMine")
    commit_all(git, repo, "stale")
    stderr = _rejected_push(git, repo)
    forced = git.run("push", "--force", "origin", "HEAD:main", cwd=repo, check=False)

    assert "fetch first" in stderr or "non-fast-forward" in stderr
    assert forced.returncode != 0
    assert "non-fast-forward" in forced.stderr
    assert client.blocks.retrieve(human_id).value == "Name: Sam (edited meanwhile)"


def test_a_garbage_receive_pack_body_is_refused_and_changes_nothing(live_server, actor, git):
    key = key_for(actor)
    agent = make_agent(sdk(live_server, key))
    clone(git, live_server, agent.id, key)
    before = _snapshot(agent.id)
    url = f"{live_server.url}/v1/git/{agent.id}/state.git/git-receive-pack"
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/x-git-receive-pack-request"}
    old = httpx.get(
        f"{live_server.url}/v1/git/{agent.id}/state.git/info/refs?service=git-upload-pack",
        headers={"Authorization": f"Bearer {key}"},
    )

    garbage = httpx.post(url, content=b"\x00garbage\xff" * 100, headers=headers)
    no_pack = httpx.post(
        url,
        content=b"00980000000000000000000000000000000000000000 1111111111111111111111111111111111111111 "
        b"refs/heads/main\x00report-status\n0000PACKnonsense",
        headers=headers,
    )

    assert garbage.status_code == 400
    assert no_pack.status_code == 400
    assert _snapshot(agent.id) == before
    after = httpx.get(
        f"{live_server.url}/v1/git/{agent.id}/state.git/info/refs?service=git-upload-pack",
        headers={"Authorization": f"Bearer {key}"},
    )
    assert after.content == old.content


def test_history_commits_match_the_block_history(live_server, actor, git):
    from apps.memory.services import Editor, block_write_read_value

    key = key_for(actor)
    client = sdk(live_server, key)
    agent = make_agent(client, tags=[])
    human_id = block_id(client, agent.id, "human")
    client.blocks.update(human_id, value="Name: Sam\nLikes tea")
    block_write_read_value(
        block=Block.objects.unscoped().get(id=human_id),
        value="Name: Sam\nLikes green tea",
        editor=Editor.agent(agent.id),
    )
    client.agents.update(agent.id, tags=[TAG])

    repo = clone(git, live_server, agent.id, key)
    log = git.run("log", "--reverse", "--format=%an|%s", cwd=repo).stdout.splitlines()

    username = User.objects.get(id=actor.user_id).username
    history = BlockHistory.objects.unscoped().filter(block__agent_attachments__agent_id=agent.id)
    assert len(log) == history.count() == 6
    assert log == [
        f"{username}|Create human",
        f"{username}|Create persona",
        f"{username}|Update human",
        "Memo|Update human",
        "Letta|Rename human to system/human",
        "Letta|Rename persona to system/persona",
    ]
    assert (repo / "system" / "human.md").read_text().endswith("---\nName: Sam\nLikes green tea")


def test_refusals_before_the_repository(live_server, actor, other_org_actor):
    key = key_for(actor)
    client = sdk(live_server, key)
    agent = make_agent(client)
    plain = make_agent(client, tags=[])
    refs = "state.git/info/refs?service=git-upload-pack"

    def get(agent_id: str, **headers: str) -> httpx.Response:
        return httpx.get(f"{live_server.url}/v1/git/{agent_id}/{refs}", headers=headers)

    basic = "Basic " + base64.b64encode(f"git:{key}".encode()).decode()
    wrong = "Basic " + base64.b64encode(b"git:sk-let-wrong").decode()
    other = get(agent.id, Authorization=f"Bearer {key_for(other_org_actor)}")
    missing = get(agent.id)
    bad = get(agent.id, Authorization=wrong)
    not_enabled = get(plain.id, Authorization=basic)
    ok = get(agent.id, Authorization=basic)

    assert other.status_code == 404
    assert (missing.status_code, missing.headers["WWW-Authenticate"].split()[0]) == (401, "Basic")
    assert (bad.status_code, bad.headers["WWW-Authenticate"].split()[0]) == (401, "Basic")
    assert not_enabled.status_code == 404
    assert f"add the tag '{TAG}'" in not_enabled.text
    assert ok.status_code == 200
    assert ok.headers["Content-Type"] == "application/x-git-upload-pack-advertisement"


def test_a_member_who_did_not_create_the_agent_may_clone_but_not_push(
    live_server, actor, org, make_user, git
):
    owner_key = key_for(actor)
    client = sdk(live_server, owner_key)
    agent = make_agent(client)
    member = make_user(org, role=Role.MEMBER)
    member_key = key_for(Actor(organization_id=org.id, user_id=member.id, role=Role.MEMBER))

    repo = clone(git, live_server, agent.id, member_key)
    before = _snapshot(agent.id)
    (repo / "system" / "persona.md").write_text("---\ndescription: ''\nlimit: 100\n---\nHijacked")
    commit_all(git, repo, "not mine")
    result = git.run("push", "origin", "HEAD:main", cwd=repo, check=False)

    assert (repo / "system" / "persona.md").exists()
    assert result.returncode != 0
    assert "403" in result.stderr
    assert _snapshot(agent.id) == before


def test_a_push_racing_an_agent_edit_of_the_same_block_loses_to_the_block_version(
    live_server, actor, git, monkeypatch
):
    """The agent's memory tool writes (compare-and-set on the version) while the push is being applied,
    after the push read the blocks: the push fails on the version and the agent's edit stays."""
    import threading

    from apps.memory import git_memory
    from apps.memory.services import Editor, block_write_read_value

    key = key_for(actor)
    client = sdk(live_server, key)
    agent = make_agent(client)
    repo = clone(git, live_server, agent.id, key)
    human_id = block_id(client, agent.id, "system/human")
    read_tree = git_memory._PushHook._read_tree

    def agent_edits_meanwhile(self, tree_id):
        def edit() -> None:
            block_write_read_value(
                block=Block.objects.unscoped().get(id=human_id),
                value="Name: Sam (agent's edit)",
                editor=Editor.agent(agent.id),
            )
            connections.close_all()

        worker = threading.Thread(target=edit)  # its own database connection, committed at once
        worker.start()
        worker.join()
        return read_tree(self, tree_id)

    monkeypatch.setattr(git_memory._PushHook, "_read_tree", agent_edits_meanwhile)
    (repo / "system" / "human.md").write_text("---\ndescription: About the user\nlimit: 200\n---\nMine")
    commit_all(git, repo, "racing")
    stderr = _rejected_push(git, repo)

    assert "changed since version" in stderr
    assert client.blocks.retrieve(human_id).value == "Name: Sam (agent's edit)"


def test_tagging_through_the_api_moves_the_blocks_under_system_at_once(live_server, actor):
    client = sdk(live_server, key_for(actor))
    tagged = make_agent(client)
    plain = make_agent(client, tags=[])

    client.agents.update(plain.id, tags=[TAG])

    assert sorted(b.label for b in client.agents.blocks.list(tagged.id)) == ["system/human", "system/persona"]
    assert sorted(b.label for b in client.agents.blocks.list(plain.id)) == ["system/human", "system/persona"]


def test_labels_with_slashes_route_through_the_agent_block_endpoints(live_server, actor, git):
    """Git memory's labels (`system/human`, `notes/todo`) through /v1/agents/{id}/core-memory/blocks/
    {block_label}: the SDK sends the slashes as they are; attach/ and detach/ still win."""
    key = key_for(actor)
    client = sdk(live_server, key)
    agent = make_agent(client)
    repo = clone(git, live_server, agent.id, key)
    (repo / "notes" / "deep").mkdir(parents=True)
    (repo / "notes" / "deep" / "todo.md").write_text("---\ndescription: ''\nlimit: 500\n---\nBuy milk")
    commit_all(git, repo, "todo")
    git.run("push", "origin", "HEAD:main", cwd=repo)

    human = client.agents.blocks.retrieve("system/human", agent_id=agent.id)
    todo = client.agents.blocks.retrieve("notes/deep/todo", agent_id=agent.id)
    updated = client.agents.blocks.update("system/human", agent_id=agent.id, value="Name: Sam (via label)")
    slash = httpx.get(
        f"{live_server.url}/v1/agents/{agent.id}/core-memory/blocks/system/persona/",
        headers={"Authorization": f"Bearer {key}"},
    )
    missing = httpx.get(
        f"{live_server.url}/v1/agents/{agent.id}/core-memory/blocks/system/nobody",
        headers={"Authorization": f"Bearer {key}"},
    )
    persona_id = block_id(client, agent.id, "system/persona")
    detached = client.agents.blocks.detach(persona_id, agent_id=agent.id)

    assert (human.label, human.value) == ("system/human", "Name: Sam")
    assert (todo.label, todo.value) == ("notes/deep/todo", "Buy milk")
    assert updated.value == "Name: Sam (via label)"
    assert client.blocks.retrieve(human.id).value == "Name: Sam (via label)"
    assert (slash.status_code, slash.json()["label"]) == (200, "system/persona")
    assert missing.status_code == 404
    assert "system/persona" not in [b.label for b in client.agents.blocks.list(agent.id)]
    assert detached.id == agent.id


def test_a_merge_with_an_older_commit_of_ours_pushes_only_the_new_commits(live_server, actor, git):
    """The merge's second parent line starts at a commit the server already has: that commit (and its
    past) is not new, so it is neither stored again nor listed twice."""
    from apps.memory.models import GitMemoryCommit

    key = key_for(actor)
    client = sdk(live_server, key)
    agent = make_agent(client)
    repo = clone(git, live_server, agent.id, key)
    human = repo / "system" / "human.md"
    persona = repo / "system" / "persona.md"
    human.write_text(human.read_text() + "\nFirst")
    commit_all(git, repo, "first")
    git.run("push", "origin", "HEAD:main", cwd=repo)
    before = GitMemoryCommit.objects.unscoped().filter(repo_id=agent.id).count()

    git.run("checkout", "-q", "-b", "side", "HEAD~1", cwd=repo)
    persona.write_text(persona.read_text() + "\nSide")
    commit_all(git, repo, "side")
    git.run("checkout", "-q", "main", cwd=repo)
    git.run("merge", "-q", "--no-edit", "side", cwd=repo)
    git.run("push", "origin", "HEAD:main", cwd=repo)

    shas = list(GitMemoryCommit.objects.unscoped().filter(repo_id=agent.id).values_list("sha", flat=True))
    assert len(shas) == before + 2 == len(set(shas))
    assert client.blocks.retrieve(block_id(client, agent.id, "system/persona")).value == "I am helpful.\nSide"
    assert client.blocks.retrieve(block_id(client, agent.id, "system/human")).value == "Name: Sam\nFirst"
    fresh = clone(git, live_server, agent.id, key, name="fresh")
    assert git.run("log", "--format=%H", cwd=fresh).stdout == git.run("log", "--format=%H", cwd=repo).stdout


def test_git_requests_count_against_the_keys_request_rate(live_server, actor, settings):
    agent = make_agent(sdk(live_server, key_for(actor)))
    key = key_for(actor)  # a key with no request counted yet
    settings.API_RATE_PER_KEY = "2/min"
    refs = f"{live_server.url}/v1/git/{agent.id}/state.git/info/refs?service=git-upload-pack"
    auth = {"Authorization": f"Bearer {key}"}

    statuses = [httpx.get(refs, headers=auth).status_code for _ in range(2)]
    throttled = httpx.get(refs, headers=auth)
    api_too = httpx.get(f"{live_server.url}/v1/agents/{agent.id}", headers=auth)

    assert statuses == [200, 200]
    assert throttled.status_code == 429
    assert 0 < int(throttled.headers["Retry-After"]) <= 60
    assert api_too.status_code == 429  # the same bucket as the key's /v1 requests
