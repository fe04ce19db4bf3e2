"""An agent's core memory as a git repository, served over git's smart HTTP protocol (Letta's MemFS path,
`/v1/git/{agent_id}/state.git`), for agents tagged `git-memory-enabled`.

Layout: each attached block is the file `<label>.md` (a label with slashes is a nested path, so Letta's
`system/human` is `system/human.md`); the file is YAML front matter (description and limit always, the
other block fields when they differ from their defaults) between `---` lines, then the block's value,
byte for byte. A label that is no valid path (empty segments, `.`, `..`, `.git`) is left out of the
repository and never touched by a push.

History: every BlockHistory row of the attached blocks is one commit, authored by whoever made the change
(user, agent, sleeptime agent, system), in the order the changes were recorded; the first access builds
the agent's whole history. Git objects are stored (GitMemoryObject) rather than rebuilt, so commit ids are
stable across requests and web processes, and a pushed commit stays the head. Every request first syncs:
under the repository's row lock it appends commits for the changes recorded since, and one "sync" commit
when the attached blocks differ from the head in any other way (a block attached or detached).

Push: the pushed head must descend from ours (fast-forward); its tree is validated as a whole (paths,
front matter, limits, read-only blocks, sizes) and applied in one transaction by the pushing user, each
edit compare-and-set on the block version the sync read, so a run that edited a block meanwhile makes the
push fail instead of being overwritten. Adding a file creates and attaches a block; removing one detaches
it (the block survives, as in Letta). dulwich speaks the protocol; nothing here parses packs.
"""

from __future__ import annotations

import io
import logging
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any, Protocol

import yaml
from django.conf import settings
from django.db import connection, transaction
from dulwich.errors import HookError
from dulwich.hooks import Hook
from dulwich.object_store import MemoryObjectStore, PackInputTooLarge
from dulwich.objects import Blob, Commit, ObjectID, ShaFile, Tree
from dulwich.pack import (  # the header decoders are private: dulwich is pinned
    DELTA_TYPES,
    OFS_DELTA,
    REF_DELTA,
    _decode_object_header,
    read_pack_header_at,
    take_msb_bytes_at,
)
from dulwich.protocol import ReceivableProtocol
from dulwich.refs import Ref
from dulwich.repo import MemoryRepo
from dulwich.server import BackendRepo, DictBackend, ReceivePackHandler, UploadPackHandler

from apps.accounts.models import User
from apps.core import permissions
from apps.core.actor import Actor
from apps.core.errors import DomainError, InvalidInput, NotFound
from apps.core.permissions import Action
from apps.memory.models import (
    DEFAULT_BLOCK_LIMIT,
    AgentBlock,
    Block,
    BlockHistory,
    GitMemoryCommit,
    GitMemoryObject,
    GitMemoryRepo,
)

logger = logging.getLogger(__name__)

GIT_MEMORY_TAG = "git-memory-enabled"  # Letta's switch (letta/services/block_manager_git.py)
SYSTEM_PREFIX = "system/"  # blocks rendered in every prompt (letta/schemas/memory.py)
BRANCH = Ref(b"refs/heads/main")
ZERO_SHA = b"0" * 40
SERVICES = ("git-upload-pack", "git-receive-pack")
_FILE_MODES = (0o100644, 0o100755)
_TREE_MODE = 0o040000
_SYSTEM_AUTHOR = b"Letta <system@letta.invalid>"


class GitMemoryNotEnabled(NotFound):
    code = "git_memory_not_enabled"


class GitRequestInvalid(InvalidInput):
    code = "git_request_invalid"


class PushRejected(DomainError):
    """A push that changes nothing; the message is what the git client prints (one line)."""

    code = "git_push_rejected"


class GitAgent(Protocol):
    """What this module needs of an agent (apps.agents' Agent, which it may not import)."""

    id: str
    organization_id: str
    name: str
    tags: list[str]
    created_by_id: str | None


# --- block files ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockFile:
    """A block as its file holds it: everything needed for a lossless round trip."""

    label: str
    value: str = ""
    description: str = ""
    limit: int = DEFAULT_BLOCK_LIMIT
    read_only: bool = False
    hidden: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    is_template: bool = False
    template_name: str = ""

    @classmethod
    def of(cls, block: Block) -> BlockFile:
        return cls(**{f.name: getattr(block, f.name) for f in fields(cls)})

    def changes_from(self, block: Block) -> dict[str, Any]:
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "label" and getattr(self, f.name) != getattr(block, f.name)
        }


_OPTIONAL_KEYS: dict[str, Any] = {
    "read_only": False,
    "hidden": False,
    "metadata": {},
    "tags": [],
    "is_template": False,
    "template_name": "",
}
_FRONT_MATTER_KEYS = ("description", "limit", *_OPTIONAL_KEYS)


def label_to_path(label: str) -> str | None:
    """`<label>.md`, or None when the label cannot be a file path in git."""
    parts = label.split("/")
    if any(p in ("", ".", "..") or p.lower() == ".git" or "\x00" in p for p in parts):
        return None
    return label + ".md"


def render_block_file(block: BlockFile) -> bytes:
    front: dict[str, Any] = {"description": block.description, "limit": block.limit}
    for key, default in _OPTIONAL_KEYS.items():
        if getattr(block, key) != default:
            front[key] = getattr(block, key)
    header = yaml.safe_dump(front, sort_keys=False, allow_unicode=True, default_flow_style=False)
    return f"---\n{header}---\n{block.value}".encode()


class _NoAliasLoader(yaml.SafeLoader):
    """safe_load without anchors and aliases: a few hundred bytes of nested aliases stand for a structure
    of billions of nodes once serialised (metadata is stored as JSON), and no block file needs them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed", mark)
        return super().compose_node(parent, index)


def parse_block_file(path: str, data: bytes) -> BlockFile:
    """The block a pushed file describes. Raises PushRejected naming the file and what is wrong."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PushRejected(f"{path}: not UTF-8 text") from None
    if "\x00" in text:
        raise PushRejected(f"{path}: contains a NUL character")
    if not text.startswith("---\n"):
        raise PushRejected(f"{path}: front matter missing (the file must start with a '---' line)")
    end = text.find("\n---\n", 3)
    if end == -1 and text.endswith("\n---"):
        end = len(text) - 4
    if end == -1:
        raise PushRejected(f"{path}: front matter not closed (no second '---' line)")
    header, value = text[4 : end + 1], text[end + 5 :]
    try:
        front = yaml.load(header, Loader=_NoAliasLoader) if header.strip() else {}  # a SafeLoader
    except yaml.YAMLError as exc:
        problem = str(exc).replace("\n", " ")[:200]
        raise PushRejected(f"{path}: front matter is not valid YAML ({problem})") from None
    if not isinstance(front, dict):
        raise PushRejected(f"{path}: front matter must be a mapping of keys to values")
    unknown = sorted(str(k) for k in front if k not in _FRONT_MATTER_KEYS)
    if unknown:
        raise PushRejected(
            f"{path}: unknown front matter key(s) {', '.join(unknown)} "
            f"(allowed: {', '.join(_FRONT_MATTER_KEYS)})"
        )
    values: dict[str, Any] = {}
    for key, expected, kind in (
        ("description", str, "text"),
        ("limit", int, "a positive number of characters"),
        ("read_only", bool, "true or false"),
        ("hidden", bool, "true or false"),
        ("is_template", bool, "true or false"),
        ("template_name", str, "text"),
        ("metadata", dict, "a mapping"),
        ("tags", list, "a list of strings"),
    ):
        if key not in front:
            continue
        item = front[key]
        if item is None and expected is str:
            item = ""
        wrong = not isinstance(item, expected) or (expected is int and isinstance(item, bool))
        if key == "limit" and not wrong:
            wrong = item < 1
        if key == "tags" and not wrong:
            wrong = not all(isinstance(tag, str) and len(tag) <= 100 for tag in item)
        if wrong:
            raise PushRejected(f"{path}: front matter '{key}' must be {kind}")
        values[key] = item
    return BlockFile(label=path[: -len(".md")], value=value, **values)


# --- building trees and commits ------------------------------------------------------------------------


class _Objects:
    """New objects of one request, to be stored once the transaction commits them."""

    def __init__(self) -> None:
        self.new: dict[bytes, ShaFile] = {}

    def add(self, obj: ShaFile) -> ObjectID:
        self.new[obj.id] = obj
        return obj.id


def _build_tree(files: dict[str, bytes], objects: _Objects) -> ObjectID:
    """The root tree id of `files` (path -> content). A path clashing with a directory is left out."""
    root: dict[str, Any] = {}
    for path in sorted(files):
        node = root
        *dirs, name = path.split("/")
        clash = False
        for part in dirs:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                clash = True
                break
            node = child
        if clash or isinstance(node.get(name), dict):
            logger.warning("git_memory.path_clash", extra={"path": path})
            continue
        node[name] = files[path]

    def write(node: dict[str, Any]) -> ObjectID:
        tree = Tree()
        for name, item in node.items():
            if isinstance(item, dict):
                tree.add(name.encode(), _TREE_MODE, write(item))
            else:
                tree.add(name.encode(), 0o100644, objects.add(Blob.from_string(item)))
        return objects.add(tree)

    return write(root)


def _make_commit(
    objects: _Objects,
    *,
    tree: bytes,
    parent: str,
    author: bytes,
    message: str,
    when: datetime,
) -> bytes:
    commit = Commit()
    commit.tree = tree
    commit.parents = [ObjectID(parent.encode())] if parent else []
    commit.author = commit.committer = author
    commit.author_time = commit.commit_time = int(when.timestamp())
    commit.author_timezone = commit.commit_timezone = 0
    commit.encoding = b"UTF-8"
    commit.message = message.encode()
    return objects.add(commit)


def _person(name: str, email: str) -> bytes:
    clean = "".join(ch for ch in name if ch not in "<>\n\r").strip() or "unknown"
    return f"{clean} <{email}>".encode()


class _Authors:
    """Commit authors of history rows, looked up once per request."""

    def __init__(self, rows: list[BlockHistory]) -> None:
        user_ids = {r.actor_id for r in rows if r.actor_type == BlockHistory.ActorType.USER and r.actor_id}
        agent_ids = {r.actor_id for r in rows if r.actor_type == BlockHistory.ActorType.AGENT and r.actor_id}
        self.users = {
            u.id: (u.username, u.email or f"{u.id}@users.letta.invalid")
            for u in User.objects.filter(id__in=user_ids)
        }
        self.agents: dict[str, tuple[str, str]] = {}
        if agent_ids:
            for agent_id, name, agent_type in AgentBlock.objects.filter(agent_id__in=agent_ids).values_list(
                "agent_id", "agent__name", "agent__agent_type"
            ):
                kind = " (sleeptime agent)" if agent_type == "sleeptime_agent" else ""
                self.agents[agent_id] = (f"{name}{kind}", agent_type)

    def author(self, row: BlockHistory) -> tuple[str, bytes]:
        """(kind, `Name <email>`) of whoever recorded `row`."""
        if row.actor_type == BlockHistory.ActorType.USER:
            name, email = self.users.get(row.actor_id, (row.actor_id or "user", "user@users.letta.invalid"))
            return "user", _person(name, email)
        if row.actor_type == BlockHistory.ActorType.AGENT:
            name, agent_type = self.agents.get(row.actor_id, (row.actor_id, ""))
            kind = "sleeptime agent" if agent_type == "sleeptime_agent" else "agent"
            return kind, _person(name, f"{row.actor_id}@agents.letta.invalid")
        return "system", _SYSTEM_AUTHOR


def _history_message(row: BlockHistory, old_label: str | None, kind: str) -> str:
    if row.version == 1 or old_label is None:
        title = f"Create {row.label}"
    elif old_label != row.label:
        title = f"Rename {old_label} to {row.label}"
    else:
        title = f"Update {row.label}"
    return f"{title}\n\nBlock {row.block_id} version {row.version}, by the {kind}.\n"


# --- pushed packs ---------------------------------------------------------------------------------------


class PackRefused(PackInputTooLarge):
    """A pushed pack past the inflation limits. dulwich reports it to git as the unpack status, so the
    client prints `remote unpack failed: <message>`; nothing is kept."""


_INFLATE_STEP = 64 * 1024


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A delta header's size (7 bits a byte, little end first) at `pos`, and the position after it."""
    size = shift = 0
    while pos < len(data):
        byte = data[pos]
        pos += 1
        size |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return size, pos
    raise PackRefused("delta header truncated")


def _inflate_bounded(data: bytes, pos: int, declared: int, keep: int) -> tuple[bytes, int]:
    """Inflate the zlib stream at `pos` in steps, keeping only its first `keep` bytes (so memory stays
    small whatever it declares), refusing it once it passes `declared`. Returns (kept bytes, position after
    the stream). zlib.error on a broken or truncated stream."""
    inflater = zlib.decompressobj()
    kept, size = b"", 0
    while not inflater.eof:
        if pos >= len(data):
            raise zlib.error("truncated")
        pending = data[pos : pos + _INFLATE_STEP]
        pos += len(pending)
        while pending and not inflater.eof:
            out = inflater.decompress(pending, _INFLATE_STEP)
            size += len(out)
            if size > declared:
                raise PackRefused(f"an object inflates past its declared size of {declared} bytes")
            if len(kept) < keep:
                kept += out[: keep - len(kept)]
            pending = inflater.unconsumed_tail
    return kept, pos - len(inflater.unused_data)


def _count_inflated(size: int, total: int, max_object: int, max_total: int) -> int:
    if size > max_object:
        raise PackRefused(f"an object of {size} bytes is over the limit of {max_object} bytes")
    if total + size > max_total:
        raise PackRefused(f"the pack inflates to more than the limit of {max_total} bytes")
    return total + size


def check_pack_bounds(data: bytes) -> None:
    """Refuse a pack whose objects would inflate past the limits, before dulwich inflates any of it: a
    small pack can declare huge objects (zeros compress about 1000:1, and a delta of a few bytes per copy
    can repeat its base). Each object's declared size (for a delta also the size of its result, from the
    delta header) must be within GIT_MEMORY_MAX_FILE_BYTES and their sum within
    GIT_MEMORY_MAX_PUSH_INFLATED_BYTES; each stream is inflated in steps and discarded here, refused when it
    outgrows what it declared. Counting every delta's result bounds the work of resolving delta chains.
    A pack broken in any other way is left to dulwich, which fails on it at the same object."""
    max_object = settings.GIT_MEMORY_MAX_FILE_BYTES
    max_total = settings.GIT_MEMORY_MAX_PUSH_INFLATED_BYTES
    max_objects = settings.GIT_MEMORY_MAX_PUSH_OBJECTS
    try:
        _, count = read_pack_header_at(data[:12])
    except Exception:  # not a pack: dulwich says so
        return
    if count > max_objects:
        raise PackRefused(f"pack has {count} objects, over the limit of {max_objects}")
    pos, total = 12, 0
    try:
        for _ in range(count):
            raw, pos, _crc = take_msb_bytes_at(data, pos)
            type_num, declared = _decode_object_header(raw)
            if type_num == OFS_DELTA:
                _, pos, _crc = take_msb_bytes_at(data, pos)
            elif type_num == REF_DELTA:
                pos += 20
            total = _count_inflated(declared, total, max_object, max_total)  # before inflating it
            head, pos = _inflate_bounded(data, pos, declared, keep=20)
            if type_num in DELTA_TYPES:
                _, at = _varint(head, 0)
                result = _varint(head, at)[0]  # the size of the object the delta makes
                total = _count_inflated(result, total, max_object, max_total)
    except (zlib.error, AssertionError, IndexError):
        return  # broken: dulwich reports it


class _Store(MemoryObjectStore):
    """The repository's objects for one request: read from GitMemoryObject when first asked for (in
    batches where a whole tree is read), so a request that needs a few objects (the ref advertisement, the
    head's files, a push) does not load the whole history; a clone or fetch loads all of them
    (`load_all`). A pushed pack is bounds-checked (check_pack_bounds) before dulwich reads it; the objects
    it brought are `received`."""

    def __init__(self, repo: GitMemoryRepo | None = None) -> None:
        super().__init__()
        self.repo = repo
        self.refused: str = ""
        self.received: set[ObjectID] = set()
        self._stored: set[ObjectID] = set()  # read from the database
        self._absent: set[ObjectID] = set()
        self._all_loaded = repo is None

    def _rows(self) -> Any:
        assert self.repo is not None
        return GitMemoryObject.objects.for_org(self.repo.organization_id).filter(repo=self.repo)

    def _add_rows(self, rows: Iterable[tuple[str, int, bytes]]) -> None:
        for sha, type_num, data in rows:
            obj = ShaFile.from_raw_string(type_num, bytes(data), sha=ObjectID(sha.encode()))
            self._data[obj.id] = obj
            self._stored.add(obj.id)

    def prefetch(self, shas: Iterable[bytes]) -> None:
        """Read, in one query, those of `shas` not read yet."""
        missing = {self._to_hexsha(ObjectID(sha)) for sha in shas} - self._data.keys() - self._absent
        if not missing or self._all_loaded:
            return
        self._add_rows(
            self._rows().filter(sha__in=[m.decode() for m in missing]).values_list("sha", "type_num", "data")
        )
        self._absent |= missing - self._data.keys()

    def prefetch_tree(self, tree_id: bytes, max_entries: int) -> None:
        """Read a tree, its subtrees and their files level by level (one query a level and kind), stopping
        past `max_entries` entries (the caller refuses such a tree anyway)."""
        level, seen = [tree_id], 0
        while level and seen <= max_entries:
            self.prefetch(level)
            children: list[bytes] = []
            files: list[bytes] = []
            for sha in level:
                tree = self._data.get(self._to_hexsha(ObjectID(sha)))
                if not isinstance(tree, Tree):
                    continue
                for entry in tree.iteritems():
                    seen += 1
                    if entry.mode == _TREE_MODE:
                        children.append(entry.sha)
                    elif entry.mode in _FILE_MODES:
                        files.append(entry.sha)
            self.prefetch(files[: max_entries + 1])
            level = children

    def load_all(self) -> None:
        if not self._all_loaded:
            known = [sha.decode() for sha in self._data]
            self._add_rows(self._rows().exclude(sha__in=known).values_list("sha", "type_num", "data"))
            self._all_loaded = True

    def __getitem__(self, name: Any) -> ShaFile:
        self.prefetch([name])
        return super().__getitem__(name)

    def contains_loose(self, sha: Any) -> bool:
        self.prefetch([sha])
        return super().contains_loose(sha)

    def stored(self, sha: bytes) -> bool:
        """Whether `sha` is an object of the repository's stored history (not one this request made)."""
        return ObjectID(sha) in self and self._to_hexsha(ObjectID(sha)) in self._stored

    def __iter__(self) -> Any:
        self.load_all()
        return super().__iter__()

    def add_thin_pack(self, read_all: Any, read_some: Any, progress: Any = None, **kwargs: Any) -> None:
        read = read_some or read_all
        chunks = []
        while chunk := read(_INFLATE_STEP):  # the body is already bounded (GIT_MEMORY_MAX_PUSH_BYTES)
            chunks.append(chunk)
        data = b"".join(chunks)
        try:
            check_pack_bounds(data)
        except PackRefused as exc:
            self.refused = str(exc)
            raise
        stream = io.BytesIO(data)
        before = set(self._data)
        super().add_thin_pack(stream.read, stream.read, progress)
        self.received = set(self._data) - before - self._stored


def _memory_repo(repo: GitMemoryRepo | None = None) -> MemoryRepo:
    memory = MemoryRepo()
    memory.object_store = _Store(repo)
    return memory


# --- the repository -------------------------------------------------------------------------------------


@dataclass
class _State:
    """The repository as one request sees it, after the sync."""

    repo: GitMemoryRepo
    blocks: dict[str, Block]  # attached blocks with a valid path, by label
    seq: int
    memory: MemoryRepo = field(default_factory=_memory_repo)


def require_enabled(agent: GitAgent) -> None:
    if GIT_MEMORY_TAG not in (agent.tags or []):
        raise GitMemoryNotEnabled(
            f"Git memory is not enabled for agent '{agent.id}': add the tag '{GIT_MEMORY_TAG}' to the agent"
        )


def _attached_blocks(agent: GitAgent) -> list[Block]:
    return list(
        Block.objects.for_org(agent.organization_id)
        .filter(agent_attachments__agent_id=agent.id)
        .order_by("created_at", "id")
    )


def _lock_repo(agent: GitAgent) -> tuple[GitMemoryRepo, bool]:
    """The agent's repository row, locked for this transaction (created if missing: True)."""
    table = GitMemoryRepo._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO {table} ("agent_id", "organization_id", "head", "head_labels", "created_at", '
            "\"updated_at\") VALUES (%s, %s, '', '{}', now(), now()) ON CONFLICT (\"agent_id\") DO NOTHING",
            [agent.id, agent.organization_id],
        )
        created = cursor.rowcount == 1
    repo = GitMemoryRepo.objects.for_org(agent.organization_id).select_for_update().get(agent_id=agent.id)
    return repo, created


def _adopt_system_labels(agent: GitAgent, blocks: list[Block]) -> None:
    """Letta, when it creates an agent's repository, moves every existing block under `system/` (they
    were all rendered in the prompt, and a git-memory agent renders only `system/` blocks). The renames
    go through block_update, so they are history, and so commits."""
    from apps.memory.services import Editor, block_update  # services re-exports this module

    system = Actor.system(agent.organization_id)  # whoever opens the repository first, even a reader
    for block in blocks:
        if block.label.startswith(SYSTEM_PREFIX):
            continue
        try:
            with transaction.atomic():
                block_update(
                    actor=system,
                    block_id=block.id,
                    label=SYSTEM_PREFIX + block.label,
                    editor=Editor(BlockHistory.ActorType.SYSTEM),
                )
        except DomainError as exc:  # a label clash on an agent sharing the block: it keeps its label
            logger.warning("git_memory.adopt_label_failed", extra={"block_id": block.id, "error": str(exc)})


def _store_of(state: _State) -> _Store:
    store = state.memory.object_store
    assert isinstance(store, _Store)
    return store


def _store_objects(repo: GitMemoryRepo, objects: Iterable[ShaFile]) -> None:
    rows = [
        GitMemoryObject(
            organization_id=repo.organization_id,
            repo=repo,
            sha=obj.id.decode(),
            type_num=obj.type_num,
            data=obj.as_raw_string(),
        )
        for obj in objects
    ]
    GitMemoryObject.objects.for_org(repo.organization_id).bulk_create(
        rows, ignore_conflicts=True, batch_size=500
    )


def _head_files(state: _State) -> dict[str, BlockFile]:
    """label -> parsed file at the head (our renders and validated pushes: all parse)."""
    if not state.repo.head:
        return {}
    store = _store_of(state)
    out: dict[str, BlockFile] = {}
    commit = store[ObjectID(state.repo.head.encode())]
    assert isinstance(commit, Commit)
    store.prefetch_tree(commit.tree, max_entries=10 * settings.GIT_MEMORY_MAX_FILES)
    for entry in store.iter_tree_contents(commit.tree):
        path = entry.path.decode()
        blob = store[entry.sha]
        try:
            parsed = parse_block_file(path, blob.as_raw_string())
        except PushRejected:
            continue
        out[parsed.label] = parsed
    return out


def _sync(actor: Actor, agent: GitAgent) -> _State:
    """Bring the repository up to date with the agent's blocks (see the module docstring). Call inside a
    transaction: it holds the repository's row lock until that transaction ends."""
    repo, created = _lock_repo(agent)
    if created:
        _adopt_system_labels(agent, _attached_blocks(agent))
    blocks = [b for b in _attached_blocks(agent) if label_to_path(b.label)]
    seq = GitMemoryCommit.objects.for_org(repo.organization_id).filter(repo=repo).count()
    state = _State(repo=repo, blocks={b.label: b for b in blocks}, seq=seq, memory=_memory_repo(repo))
    committed: set[str] = set()
    for ids in (
        GitMemoryCommit.objects.for_org(repo.organization_id)
        .filter(repo=repo)
        .order_by()
        .values_list("history_ids", flat=True)
    ):
        committed.update(ids)
    history = BlockHistory.objects.for_org(repo.organization_id).filter(block_id__in=[b.id for b in blocks])
    # Ids only, unordered (the model's ordering would join and sort the blocks): cheap.
    new_ids = [i for i in history.order_by().values_list("id", flat=True) if i not in committed]
    rows = list(history.filter(id__in=new_ids).order_by("created_at", "version", "id")) if new_ids else []
    objects = _Objects()
    files = _head_files(state)
    labels: dict[str, str] = dict(repo.head_labels)
    by_id = {b.id: b for b in blocks}
    authors = _Authors(rows)
    for row in rows:
        block = by_id[row.block_id]
        old_label = labels.get(row.block_id)
        previous = files.pop(old_label, None) if old_label else None
        if row.version == block.version:
            now_file = BlockFile.of(block)  # the latest change: every field, not only those history keeps
        else:
            base = previous or BlockFile.of(block)
            now_file = replace(
                base, label=row.label, value=row.value_after, description=row.description, limit=row.limit
            )
        if label_to_path(now_file.label):
            files[now_file.label] = now_file
            labels[row.block_id] = now_file.label
        kind, author = authors.author(row)
        _append_commit(
            state,
            objects,
            files,
            source=GitMemoryCommit.Source.HISTORY,
            author=author,
            message=_history_message(row, old_label, kind),
            when=row.created_at,
            history_ids=[row.id],
        )
    desired = {b.label: BlockFile.of(b) for b in blocks}
    if files != desired or not repo.head:
        _append_commit(
            state,
            objects,
            desired,
            source=GitMemoryCommit.Source.SYNC,
            author=_SYSTEM_AUTHOR,
            message="Sync memory with the agent's blocks\n" if repo.head else "Initialize memory\n",
            when=max((b.updated_at for b in blocks), default=repo.created_at),
            history_ids=[],
        )
    if objects.new:
        repo.head_labels = {b.id: b.label for b in blocks}
        _store_objects(repo, objects.new.values())
        repo.save(update_fields=["head", "head_labels", "updated_at"])
        for obj in objects.new.values():
            state.memory.object_store.add_object(obj)
    state.memory.refs.set_symbolic_ref(Ref(b"HEAD"), BRANCH)
    state.memory.refs[BRANCH] = ObjectID(repo.head.encode())
    return state


def _append_commit(
    state: _State,
    objects: _Objects,
    files: dict[str, BlockFile],
    *,
    source: str,
    author: bytes,
    message: str,
    when: datetime,
    history_ids: list[str],
) -> None:
    rendered = {label_to_path(f.label) or "": render_block_file(f) for f in files.values()}
    rendered.pop("", None)
    tree = _build_tree(rendered, objects)
    sha = _make_commit(objects, tree=tree, parent=state.repo.head, author=author, message=message, when=when)
    name, _, email = author.decode().partition(" <")
    GitMemoryCommit.objects.for_org(state.repo.organization_id).create(
        organization_id=state.repo.organization_id,
        repo=state.repo,
        seq=state.seq,
        sha=sha.decode(),
        source=source,
        author_name=name,
        author_email=email.rstrip(">"),
        message=message,
        committed_at=when,
        history_ids=history_ids,
    )
    state.seq += 1
    state.repo.head = sha.decode()


# --- push -----------------------------------------------------------------------------------------------


class _PushHook(Hook):
    """dulwich's `update` hook: validates and applies a push; a HookError is git's `remote rejected`."""

    def __init__(self, actor: Actor, agent: GitAgent, state: _State) -> None:
        self.actor, self.agent, self.state = actor, agent, state
        self.applied = False

    def execute(self, *args: Any) -> tuple[bytes, bytes]:
        ref, old, new = args
        try:
            with transaction.atomic():
                self._apply(ref, old, new)
        except PushRejected as exc:
            raise HookError(exc.message) from None
        except DomainError as exc:  # a block service refused (limit, permission, concurrent edit)
            raise HookError(str(exc).replace("\n", " ")) from None
        self.applied = True
        return b"", b""

    def _apply(self, ref: bytes, old: bytes, pushed_head: bytes) -> None:
        state, new = self.state, ObjectID(pushed_head)
        if ref != BRANCH:
            raise PushRejected("only refs/heads/main can be pushed")
        if new == ZERO_SHA:
            raise PushRejected("the main branch cannot be deleted")
        if old != state.repo.head.encode():
            raise PushRejected("non-fast-forward: memory changed since you fetched; pull and push again")
        store = state.memory.object_store
        pushed = self._new_commits(new)
        commit = store[new]
        assert isinstance(commit, Commit)
        files = self._read_tree(commit.tree)
        touched = self._write_blocks(files)
        history_ids = self._new_history_ids(touched)
        _store_objects(state.repo, self._reachable_new_objects(pushed))
        for position, sha in enumerate(pushed):
            item = store[sha]
            assert isinstance(item, Commit)
            name, _, email = item.author.decode("utf-8", "replace").partition(" <")
            GitMemoryCommit.objects.for_org(state.repo.organization_id).create(
                organization_id=state.repo.organization_id,
                repo=state.repo,
                seq=state.seq,
                sha=sha.decode(),
                source=GitMemoryCommit.Source.PUSH,
                author_name=name[:300],
                author_email=email.rstrip(">")[:300],
                message=item.message.decode("utf-8", "replace")[:10_000],
                committed_at=datetime.fromtimestamp(item.author_time, tz=UTC),
                history_ids=history_ids if position == len(pushed) - 1 else [],
            )
            state.seq += 1
        state.repo.head = new.decode()
        state.repo.head_labels = {
            b.id: b.label for b in _attached_blocks(self.agent) if label_to_path(b.label)
        }
        state.repo.save(update_fields=["head", "head_labels", "updated_at"])

    def _new_commits(self, new: ObjectID) -> list[ObjectID]:
        """The pushed commits, parents before children; refuses a head that does not descend from ours."""
        store, head = _store_of(self.state), self.state.repo.head.encode()
        limit = settings.GIT_MEMORY_MAX_PUSH_COMMITS
        order: list[ObjectID] = []
        visited: set[bytes] = set()
        stack: list[tuple[ObjectID, bool]] = [(new, False)]
        found_head = False
        while stack:
            sha, expanded = stack.pop()
            if expanded:
                order.append(sha)
                continue
            if sha == head:
                found_head = True
                continue
            if sha in visited:
                continue
            if sha not in store.received and store.stored(sha):
                continue  # an older commit of ours (a merge's other parent): not new, and its past is ours
            visited.add(sha)
            if len(visited) > limit:
                raise PushRejected(f"too many commits in one push (at most {limit})")
            try:
                item = store[sha]
            except KeyError:
                raise PushRejected("non-fast-forward: the pushed history does not contain ours") from None
            if not isinstance(item, Commit):
                raise PushRejected("the pushed ref is not a commit")
            stack.append((sha, True))
            stack.extend((parent, False) for parent in item.parents)
        if not found_head:
            raise PushRejected("non-fast-forward: the pushed history does not contain ours; pull first")
        return order

    def _read_tree(self, tree_id: ObjectID) -> dict[str, BlockFile]:
        store = _store_of(self.state)
        max_files, max_bytes = settings.GIT_MEMORY_MAX_FILES, settings.GIT_MEMORY_MAX_FILE_BYTES
        store.prefetch_tree(tree_id, max_entries=max_files)  # the files the push did not change
        out: dict[str, BlockFile] = {}
        for count, entry in enumerate(store.iter_tree_contents(tree_id), start=1):
            try:
                path = entry.path.decode("utf-8")
            except UnicodeDecodeError:
                raise PushRejected(f"{entry.path!r}: file names must be UTF-8") from None
            if count > max_files:
                raise PushRejected(f"too many files (at most {max_files})")
            if entry.mode not in _FILE_MODES:
                raise PushRejected(f"{path}: only regular files are allowed (no links or submodules)")
            if not path.endswith(".md"):
                raise PushRejected(f"{path}: only .md files (one per memory block) are allowed")
            label = path[: -len(".md")]
            if label_to_path(label) != path:
                raise PushRejected(f"{path}: not a valid block path")
            if len(label) > 200:
                raise PushRejected(f"{path}: a block label may be at most 200 characters")
            blob = store[entry.sha]
            data = blob.as_raw_string()
            if len(data) > max_bytes:
                raise PushRejected(f"{path}: file is {len(data)} bytes, over the limit of {max_bytes}")
            parsed = parse_block_file(path, data)
            if len(parsed.value) > parsed.limit:
                raise PushRejected(
                    f"{path}: value is {len(parsed.value)} characters, over the block's limit of "
                    f"{parsed.limit}"
                )
            out[parsed.label] = parsed
        return out

    def _write_blocks(self, files: dict[str, BlockFile]) -> dict[str, int]:
        """Create, update and detach blocks as the tree says; returns {block id: version before} of the
        blocks written (0: created)."""
        from apps.memory.services import (
            Editor,
            block_attach_to_agent,
            block_create,
            block_detach_from_agent,
            block_update,
        )

        touched: dict[str, int] = {}

        actor, blocks = self.actor, self.state.blocks
        editor = Editor.for_actor(actor)
        for label, block in blocks.items():
            pushed = files.get(label)
            if block.read_only and (pushed is None or pushed.changes_from(block)):
                raise PushRejected(f"{label}.md: block '{label}' is read-only and cannot be changed by git")
        for label, pushed in files.items():
            existing = blocks.get(label)
            if existing is None:
                created = block_create(
                    actor=actor,
                    label=label,
                    value=pushed.value,
                    limit=pushed.limit,
                    description=pushed.description,
                    read_only=pushed.read_only,
                    is_template=pushed.is_template,
                    template_name=pushed.template_name,
                    hidden=pushed.hidden,
                    metadata=pushed.metadata,
                    tags=pushed.tags,
                )
                block_attach_to_agent(actor=actor, agent_id=self.agent.id, block=created)
                touched[created.id] = 0
            elif changes := pushed.changes_from(existing):
                block_update(
                    actor=actor,
                    block_id=existing.id,
                    editor=editor,
                    expected_version=existing.version,
                    **changes,
                )
                touched[existing.id] = existing.version
        for label, block in blocks.items():
            if label not in files and not block_detach_from_agent(agent_id=self.agent.id, block_id=block.id):
                raise PushRejected(f"{label}.md: block was detached meanwhile; pull and push again")
        return touched

    def _new_history_ids(self, touched: dict[str, int]) -> list[str]:
        """The history rows this push wrote (recorded as the pushed commit, not as commits of their own)."""
        rows = BlockHistory.objects.for_org(self.agent.organization_id).filter(block_id__in=list(touched))
        return [
            row.id for row in rows.order_by("created_at", "version") if row.version > touched[row.block_id]
        ]

    def _reachable_new_objects(self, commits: list[ObjectID]) -> list[ShaFile]:
        """The objects the pack brought that the new commits use. An object not received is stored
        already, and so is everything it refers to."""
        store = _store_of(self.state)
        out: dict[bytes, ShaFile] = {}
        for sha in commits:
            commit = store[sha]
            assert isinstance(commit, Commit)
            out[sha] = commit
            pending = [commit.tree]
            while pending:
                tree_id = pending.pop()
                if tree_id in out or tree_id not in store.received:
                    continue
                tree = store[tree_id]
                out[tree_id] = tree
                assert isinstance(tree, Tree)
                for entry in tree.iteritems():
                    if entry.mode == _TREE_MODE:
                        pending.append(entry.sha)
                    elif entry.sha not in out and entry.sha in store.received:
                        out[entry.sha] = store[entry.sha]
        return list(out.values())


# --- the protocol (dulwich) -----------------------------------------------------------------------------


def _backend(state: _State) -> DictBackend:
    repos: dict[str, BackendRepo] = {"/": state.memory}  # type: ignore[dict-item]  # MemoryRepo is one
    return DictBackend(repos)


def _require_reader(actor: Actor, agent: GitAgent) -> None:
    require_enabled(agent)
    permissions.require(
        actor, Action.AGENT_USE, creator_id=agent.created_by_id, subject=f"agent '{agent.name}'"
    )


def _require_pusher(actor: Actor, agent: GitAgent) -> None:
    require_enabled(agent)
    permissions.require(
        actor, Action.AGENT_CONFIGURE, creator_id=agent.created_by_id, subject=f"agent '{agent.name}'"
    )


def _service(name: str) -> str:
    if name not in SERVICES:
        raise GitRequestInvalid(f"Unknown git service {name!r}: use git-upload-pack or git-receive-pack")
    return name


def decode_body(body: bytes, content_encoding: str) -> bytes:
    """The request body, gunzipped when git compressed it, never past GIT_MEMORY_MAX_PUSH_BYTES."""
    limit = settings.GIT_MEMORY_MAX_PUSH_BYTES
    if len(body) > limit:
        raise GitRequestInvalid(f"Request body over {limit} bytes")
    if content_encoding.strip().lower() not in ("gzip", "x-gzip"):
        return body
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error:
        raise GitRequestInvalid("Request body is not valid gzip") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise GitRequestInvalid(f"Request body over {limit} bytes once decompressed")
    return out


def git_info_refs(*, actor: Actor, agent: GitAgent, service: str) -> bytes:
    """The ref advertisement of `service` (smart HTTP's `info/refs`). Raises GitMemoryNotEnabled,
    PermissionDenied, GitRequestInvalid."""
    service = _service(service)
    (_require_pusher if service == "git-receive-pack" else _require_reader)(actor, agent)
    with transaction.atomic():
        state = _sync(actor, agent)
    out = io.BytesIO()
    proto = ReceivableProtocol(io.BytesIO().read, out.write)
    handler_cls = ReceivePackHandler if service == "git-receive-pack" else UploadPackHandler
    handler = handler_cls(_backend(state), ["/"], proto, stateless_rpc=True, advertise_refs=True)
    proto.write_pkt_line(f"# service={service}\n".encode())
    proto.write_pkt_line(None)
    handler.handle()
    return out.getvalue()


def git_upload_pack(*, actor: Actor, agent: GitAgent, body: bytes) -> bytes:
    """Answer a fetch or clone. Raises GitMemoryNotEnabled, PermissionDenied, GitRequestInvalid."""
    _require_reader(actor, agent)
    with transaction.atomic():
        state = _sync(actor, agent)
        _store_of(state).load_all()  # dulwich walks the history to find what the client lacks
    out = io.BytesIO()
    proto = ReceivableProtocol(io.BytesIO(body).read, out.write)
    handler = UploadPackHandler(_backend(state), ["/"], proto, stateless_rpc=True)
    try:
        handler.handle()
    except (DomainError, HookError):
        raise
    except Exception as exc:  # dulwich on a malformed request: several exception types
        logger.info("git_memory.bad_upload_pack", extra={"agent_id": agent.id, "error": repr(exc)[:200]})
        raise GitRequestInvalid("Malformed git-upload-pack request") from None
    return out.getvalue()


def git_receive_pack(*, actor: Actor, agent: GitAgent, body: bytes) -> bytes:
    """Apply a push (see the module docstring); a refused push is reported to git in the response and
    changes nothing. Raises GitMemoryNotEnabled, PermissionDenied, GitRequestInvalid (a body that is no
    push at all: nothing changes either)."""
    _require_pusher(actor, agent)
    with transaction.atomic():
        state = _sync(actor, agent)
        hook = _PushHook(actor, agent, state)
        state.memory.hooks["update"] = hook
        out = io.BytesIO()
        proto = ReceivableProtocol(io.BytesIO(body).read, out.write)
        handler = ReceivePackHandler(_backend(state), ["/"], proto, stateless_rpc=True)
        try:
            handler.handle()
        except Exception as exc:  # dulwich on a malformed request: several exception types
            if hook.applied:
                raise
            logger.info("git_memory.bad_receive_pack", extra={"agent_id": agent.id, "error": repr(exc)[:200]})
            raise GitRequestInvalid("Malformed git-receive-pack request") from None
        if isinstance(store := state.memory.object_store, _Store) and store.refused:
            logger.info("git_memory.pack_refused", extra={"agent_id": agent.id, "reason": store.refused})
            return out.getvalue()  # git prints "remote unpack failed: <why>"; nothing was kept
        if not hook.applied and (body[:4] in (b"", b"0000") or b"unpack ok" not in out.getvalue()):
            # No ref update at all, or a pack dulwich could not read: nothing was applied, say so.
            raise GitRequestInvalid("Malformed git-receive-pack request: no readable ref update or pack")
    return out.getvalue()


def git_memory_enable(*, actor: Actor, agent: GitAgent) -> None:
    """Build the repository of an agent just tagged `git-memory-enabled` (the first time: its blocks move
    under `system/`, as Letta's enable_git_memory_for_agent does, and its whole history becomes commits).
    Idempotent. Call after the tag is saved, from whatever added it. Raises GitMemoryNotEnabled,
    PermissionDenied (AGENT_CONFIGURE)."""
    _require_pusher(actor, agent)
    with transaction.atomic():
        _sync(actor, agent)


def git_memory_tags_saved(*, agent: GitAgent) -> None:
    """Call inside the transaction that saved an agent's tags (agent_create, agent_update, the admin), after
    the caller checked the actor may change them. Letta builds the repository (moving the blocks under
    `system/`) as soon as the tag is added: so do we, once that transaction has committed (its blocks are
    attached by then), as the system, and only when the agent is tagged and has no repository yet."""
    if GIT_MEMORY_TAG not in (agent.tags or []):
        return
    organization_id, agent_id = agent.organization_id, agent.id

    def build() -> None:
        if GitMemoryRepo.objects.for_org(organization_id).filter(agent_id=agent_id).exists():
            return
        with transaction.atomic():
            _sync(Actor.system(organization_id), agent)

    transaction.on_commit(build, robust=True)


# --- reading the history (the ADE) ----------------------------------------------------------------------


@dataclass(frozen=True)
class CommitView:
    sha: str
    author_name: str
    author_email: str
    message: str
    committed_at: datetime
    source: str

    @property
    def title(self) -> str:
        return self.message.splitlines()[0] if self.message else ""


def git_commit_log(*, actor: Actor, agent: GitAgent, limit: int = 200) -> list[CommitView]:
    """The repository's commits, newest first (synced first, so it matches what a clone gets). Raises
    GitMemoryNotEnabled, PermissionDenied."""
    _require_reader(actor, agent)
    with transaction.atomic():
        state = _sync(actor, agent)
    rows = (
        GitMemoryCommit.objects.for_org(state.repo.organization_id)
        .filter(repo=state.repo)
        .order_by("-seq")[:limit]
    )
    return [
        CommitView(r.sha, r.author_name, r.author_email, r.message, r.committed_at, r.source) for r in rows
    ]
