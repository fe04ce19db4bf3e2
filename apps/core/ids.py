"""Letta-style public ids: `<prefix>-<uuid4>`, used as primary keys so every surface shows one id."""

from __future__ import annotations

import re
import uuid

ID_MAX_LENGTH = 64
_UUID4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4()}"


def is_valid_id(prefix: str, value: str) -> bool:
    return re.fullmatch(rf"{re.escape(prefix)}-{_UUID4}", value) is not None


# Named module-level defaults, because migrations serialise callables by import path.
def new_org_id() -> str:
    return new_id("org")


def new_user_id() -> str:
    return new_id("user")


def new_api_key_id() -> str:
    return new_id("apikey")


def new_invitation_id() -> str:
    return new_id("invitation")


def new_provider_id() -> str:
    return new_id("provider")


def new_sandbox_config_id() -> str:
    return new_id("sandbox")


def new_sandbox_env_id() -> str:
    return new_id("sandbox-env")


def new_block_id() -> str:
    return new_id("block")


def new_block_history_id() -> str:
    return new_id("block-history")


def new_archive_id() -> str:
    return new_id("archive")


def new_passage_id() -> str:
    return new_id("passage")


def new_tool_id() -> str:
    return new_id("tool")


def new_agent_id() -> str:
    return new_id("agent")


def new_agent_env_id() -> str:
    return new_id("agent-env")


def new_conversation_id() -> str:
    return new_id("conv")


def new_message_id() -> str:
    return new_id("message")


def new_run_id() -> str:
    return new_id("run")


def new_step_id() -> str:
    return new_id("step")


def new_identity_id() -> str:
    return new_id("identity")


def new_group_id() -> str:
    return new_id("group")


def new_group_turn_id() -> str:
    return new_id("group-turn")
