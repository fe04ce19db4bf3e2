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
