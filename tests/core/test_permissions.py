"""The role matrix as pure code, and the README table that is rendered from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.core.actor import Actor, Role
from apps.core.errors import PermissionDenied
from apps.core.permissions import Action, allows, matrix_table, require

README = Path(__file__).resolve().parents[2] / "README.md"


def actor(role: Role, user_id: str | None = "user-1") -> Actor:
    return Actor(organization_id="org-1", user_id=user_id, role=role)


@pytest.mark.parametrize(
    ("role", "expected"),
    [(Role.OWNER, True), (Role.ADMIN, True), (Role.SYSTEM, True), (Role.MEMBER, False)],
)
def test_roles_decide_where_the_creator_is_someone_else(role: Role, expected: bool) -> None:
    assert allows(actor(role), Action.AGENT_DELETE, creator_id="user-2") is expected


def test_a_member_may_do_to_what_they_created_what_admins_may() -> None:
    assert allows(actor(Role.MEMBER), Action.AGENT_CONFIGURE, creator_id="user-1")
    assert not allows(actor(Role.MEMBER), Action.TOOL_RUN_CODE, creator_id="user-1")


def test_a_creator_without_a_user_or_an_object_without_a_creator_is_no_match() -> None:
    assert not allows(actor(Role.MEMBER, user_id=None), Action.BLOCK_WRITE, creator_id=None)
    assert not allows(actor(Role.MEMBER), Action.BLOCK_WRITE, creator_id=None)


def test_a_shared_object_is_no_longer_its_creators_alone() -> None:
    member = actor(Role.MEMBER)
    assert not allows(member, Action.TOOL_WRITE, creator_id="user-1", shared=True)
    assert allows(actor(Role.ADMIN), Action.TOOL_WRITE, creator_id="user-2", shared=True)


def test_admins_do_not_mint_keys_for_others_or_manage_members() -> None:
    admin = actor(Role.ADMIN)
    assert not allows(admin, Action.API_KEY_MINT_FOR_OTHERS)
    assert not allows(admin, Action.MEMBER_MANAGE)
    assert allows(actor(Role.OWNER), Action.MEMBER_MANAGE)


def test_a_refusal_says_who_may() -> None:
    with pytest.raises(PermissionDenied) as refused:
        require(actor(Role.MEMBER), Action.TOOL_WRITE, creator_id="user-1", shared=True, subject="tool 'add'")

    assert refused.value.message.startswith("Not allowed (tool 'add'): other people's agents use it")


def test_the_readme_table_is_the_matrix() -> None:
    assert matrix_table() in README.read_text()
