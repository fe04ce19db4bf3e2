from apps.core.errors import InvalidInput, NotFound


class AgentNotFound(NotFound):
    code = "agent_not_found"


class InvalidAgentName(InvalidInput):
    code = "invalid_agent_name"
