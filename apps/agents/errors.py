from __future__ import annotations

from django.conf import settings

from apps.core.errors import Conflict, InvalidInput, NotFound


class AgentNotFound(NotFound):
    code = "agent_not_found"


class InvalidAgentName(InvalidInput):
    code = "invalid_agent_name"


class PendingApproval(Conflict):
    """A normal message while a tool call awaits approval (Letta answers 409 PENDING_APPROVAL)."""

    code = "PENDING_APPROVAL"

    def __init__(self, message: str, *, pending_request_id: str) -> None:
        super().__init__(message)
        self.pending_request_id = pending_request_id


class NoPendingApproval(InvalidInput):
    code = "no_pending_approval"


class ApprovalAlreadyDecided(Conflict):
    """A decision for an approval request that is no longer the one awaiting it (decided meanwhile)."""

    code = "approval_already_decided"


class ToolRulesChanged(Conflict):
    """An edit of a tool rule made on a copy of the agent's rules that someone changed since."""

    code = "tool_rules_changed"


class MaxStepsExceeded(InvalidInput):
    """A request's max_steps above its organisation's limit (the API answers 422)."""

    code = "max_steps_exceeded"


class AgentFileError(InvalidInput):
    """An agent file that cannot be imported (corrupt JSON, legacy format, bad fields or references)."""

    code = "invalid_agent_file"


class AgentFileTooLarge(AgentFileError):
    """A file past AGENT_FILE_MAX_BYTES (the API answers 413)."""

    code = "agent_file_too_large"

    @classmethod
    def over_limit(cls) -> AgentFileTooLarge:
        limit = settings.AGENT_FILE_MAX_BYTES
        return cls(f"The agent file is larger than {limit:,} bytes (the limit, AGENT_FILE_MAX_BYTES)")
