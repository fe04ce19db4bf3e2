"""Letta's wire forms of the agents app's data, for the adapters (apps.api, apps.ade): stored messages as
LettaMessage dicts, usage statistics and stop reasons, and the in-context id list the API shows (the
thread's stored system message first). Pure code; the adapters import it from here, not from the loop."""

from apps.agents.loop.convert import to_letta_messages
from apps.agents.loop.events import StopReasonEvent, UsageStatistics
from apps.agents.system_messages import with_thread_system_message

__all__ = ["StopReasonEvent", "UsageStatistics", "to_letta_messages", "with_thread_system_message"]
