from apps.core.errors import Conflict, DomainError, InvalidInput


class McpServerError(DomainError):
    """The MCP server could not be reached, did not answer in time, or broke the protocol.

    `message` is short and safe to show a model; `stderr_tail` (stdio) is for the admin and the logs.
    """

    code = "mcp_server_error"

    def __init__(self, message: str, *, stderr_tail: str = "", timed_out: bool = False) -> None:
        super().__init__(message)
        self.stderr_tail = stderr_tail
        self.timed_out = timed_out


class McpToolNameConflict(Conflict):
    code = "mcp_tool_name_conflict"


class ToolSchemaError(InvalidInput):
    """Tool source from which no schema can be built; the message says what to fix."""

    code = "invalid_tool_schema"
