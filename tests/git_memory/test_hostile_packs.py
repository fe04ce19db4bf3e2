"""Pushed packs that would inflate far past their size (zip bombs, delta bombs) are refused from their
object headers and while inflating, before the server holds them: git prints `remote unpack failed`,
nothing changes. Real git client where it can make such a pack, raw receive-pack bodies otherwise."""

from __future__ import annotations

import hashlib
import struct
import tracemalloc
import zlib
from collections.abc import Iterator

import httpx
import pytest
from dulwich.object_format import DEFAULT_OBJECT_FORMAT
from dulwich.objects import Commit, ObjectID, Tree
from dulwich.pack import OFS_DELTA, pack_object_header
from dulwich.protocol import pkt_line

from apps.agents.selectors import agent_get
from apps.memory.models import GitMemoryRepo
from apps.memory.services import git_receive_pack
from tests.git_memory.test_git_http import (  # noqa: F401 - the autouse fixtures apply here too
    _no_persistent_connections_in_server_threads,
    _refused_openai,
    _rejected_push,
    _snapshot,
    clone,
    commit_all,
    git,
    key_for,
    make_agent,
    sdk,
)

pytestmark = pytest.mark.django_db(transaction=True)

MiB = 1024 * 1024
BLOB, TREE, COMMIT = 3, 2, 1


def _zeros_stream(size: int) -> Iterator[bytes]:
    """zlib of `size` zero bytes, made 1 MiB at a time (the test never holds the inflated object)."""
    compressor = zlib.compressobj(9)
    chunk = b"\0" * MiB
    for start in range(0, size, MiB):
        yield compressor.compress(chunk[: min(MiB, size - start)])
    yield compressor.flush()


def _zeros_sha(size: int) -> bytes:
    sha = hashlib.sha1(b"blob %d\0" % size)
    chunk = b"\0" * MiB
    for start in range(0, size, MiB):
        sha.update(chunk[: min(MiB, size - start)])
    return sha.hexdigest().encode()


def _delta_size(size: int) -> bytes:
    out = bytearray()
    while size > 0x7F:
        out.append(0x80 | (size & 0x7F))
        size >>= 7
    return bytes([*out, size])


def _entry(type_num: int, size: int, compressed: bytes, delta_base: int | None = None) -> bytes:
    return bytes(pack_object_header(type_num, delta_base, size, DEFAULT_OBJECT_FORMAT)) + compressed


def _pack(entries: list[bytes]) -> bytes:
    body = b"PACK" + struct.pack(">LL", 2, len(entries)) + b"".join(entries)
    return body + hashlib.sha1(body).digest()


def _commit_entries(head: str, blob_sha: bytes) -> tuple[bytes, list[bytes]]:
    """A commit (child of `head`) whose tree holds `blob_sha` as big.md, as pack entries."""
    tree = Tree()
    tree.add(b"big.md", 0o100644, ObjectID(blob_sha))
    commit = Commit()
    commit.tree, commit.parents = tree.id, [ObjectID(head.encode())]
    commit.author = commit.committer = b"Mallory <m@example.com>"
    commit.author_time = commit.commit_time = 1_700_000_000
    commit.author_timezone = commit.commit_timezone = 0
    commit.message = b"bomb\n"
    entries = [
        _entry(kind, len(raw), zlib.compress(raw))
        for kind, raw in ((TREE, tree.as_raw_string()), (COMMIT, commit.as_raw_string()))
    ]
    return commit.id, entries


def _receive_pack_body(head: str, new: bytes, pack: bytes) -> bytes:
    command = pkt_line(head.encode() + b" " + new + b" refs/heads/main\0report-status\n")
    return command + b"0000" + pack


def _zip_bomb_body(head: str, size: int) -> bytes:
    new, entries = _commit_entries(head, _zeros_sha(size))
    blob = _entry(BLOB, size, b"".join(_zeros_stream(size)))
    return _receive_pack_body(head, new, _pack([*entries, blob]))


def _post(live_server, agent_id: str, key: str, body: bytes) -> httpx.Response:
    return httpx.post(
        f"{live_server.url}/v1/git/{agent_id}/state.git/git-receive-pack",
        content=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/x-git-receive-pack-request"},
        timeout=30,
    )


def _head(agent_id: str) -> str:
    return GitMemoryRepo.objects.unscoped().get(agent_id=agent_id).head


def test_a_zip_bomb_is_refused_from_its_header_and_changes_nothing(live_server, actor, git):  # noqa: F811
    key = key_for(actor)
    agent = make_agent(sdk(live_server, key))
    clone(git, live_server, agent.id, key)
    before, head = _snapshot(agent.id), _head(agent.id)
    body = _zip_bomb_body(head, 200 * MiB)

    response = _post(live_server, agent.id, key, body)

    assert len(body) < 400 * 1024
    assert response.status_code == 200
    assert b"unpack an object of 209715200 bytes is over the limit of 1048576 bytes" in response.content
    assert _snapshot(agent.id) == before
    assert _head(agent.id) == head


def test_the_refusal_comes_before_inflating(live_server, actor, git):  # noqa: F811
    """In process, to measure: refusing a 200 MiB object never allocates more than a few MiB."""
    key = key_for(actor)
    agent = make_agent(sdk(live_server, key))
    clone(git, live_server, agent.id, key)
    body = _zip_bomb_body(_head(agent.id), 200 * MiB)
    loaded = agent_get(actor=actor, agent_id=agent.id)

    tracemalloc.start()
    try:
        result = git_receive_pack(actor=actor, agent=loaded, body=body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert b"unpack an object of 209715200 bytes is over the limit" in result
    assert peak < 8 * MiB


def test_an_object_inflating_past_its_declared_size_is_refused(live_server, actor, git):  # noqa: F811
    key = key_for(actor)
    agent = make_agent(sdk(live_server, key))
    clone(git, live_server, agent.id, key)
    before, head = _snapshot(agent.id), _head(agent.id)
    new, entries = _commit_entries(head, _zeros_sha(100))
    liar = _entry(BLOB, 100, b"".join(_zeros_stream(50 * MiB)))  # says 100 bytes, inflates to 50 MiB

    response = _post(live_server, agent.id, key, _receive_pack_body(head, new, _pack([*entries, liar])))

    assert b"unpack an object inflates past its declared size of 100 bytes" in response.content
    assert _snapshot(agent.id) == before
    assert _head(agent.id) == head


def test_a_delta_bomb_is_refused_from_its_delta_header(live_server, actor, git):  # noqa: F811
    """A 1000-byte base and 3-byte copy instructions that repeat it: 300 KB of delta makes 100 MB."""
    key = key_for(actor)
    agent = make_agent(sdk(live_server, key))
    clone(git, live_server, agent.id, key)
    before, head = _snapshot(agent.id), _head(agent.id)
    base = b"a" * 1000
    copies = 100_000
    delta = _delta_size(len(base)) + _delta_size(len(base) * copies)
    delta += bytes([0xB0, 0xE8, 0x03]) * copies  # copy offset 0, size 1000
    base_entry = _entry(BLOB, len(base), zlib.compress(base))
    new, entries = _commit_entries(head, b"1" * 40)
    delta_entry = _entry(OFS_DELTA, len(delta), zlib.compress(delta), delta_base=len(base_entry))

    response = _post(
        live_server, agent.id, key, _receive_pack_body(head, new, _pack([*entries, base_entry, delta_entry]))
    )

    assert b"unpack an object of 100000000 bytes is over the limit of 1048576 bytes" in response.content
    assert _snapshot(agent.id) == before
    assert _head(agent.id) == head


def test_a_real_push_of_a_big_file_is_refused_by_git_with_the_reason(live_server, actor, git):  # noqa: F811
    key = key_for(actor)
    agent = make_agent(sdk(live_server, key))
    repo = clone(git, live_server, agent.id, key)
    before, head = _snapshot(agent.id), _head(agent.id)

    with (repo / "system" / "big.md").open("wb") as out:
        for _ in range(20):
            out.write(b"\0" * MiB)
    commit_all(git, repo, "20 MiB of zeros")
    stderr = _rejected_push(git, repo)

    assert "remote unpack failed: an object of 20971520 bytes is over the limit of 1048576 bytes" in stderr
    assert _snapshot(agent.id) == before
    assert _head(agent.id) == head


def test_a_push_over_the_total_inflated_limit_is_refused(live_server, actor, git, settings):  # noqa: F811
    settings.GIT_MEMORY_MAX_PUSH_INFLATED_BYTES = 100_000
    key = key_for(actor)
    agent = make_agent(sdk(live_server, key))
    repo = clone(git, live_server, agent.id, key)
    before = _snapshot(agent.id)

    for name in ("one", "two"):
        (repo / f"{name}.md").write_text("---\ndescription: ''\nlimit: 100000\n---\n" + name[0] * 60_000)
    commit_all(git, repo, "two big blocks")
    stderr = _rejected_push(git, repo)

    assert "remote unpack failed: the pack inflates to more than the limit of 100000 bytes" in stderr
    assert _snapshot(agent.id) == before
