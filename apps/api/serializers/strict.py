"""Fields Letta documents that this server does not serve (yet): refused with a 422 that names them,
never dropped. A request may still send them empty (null, false, []) as the SDK's defaults do."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers

CLOUD_ONLY = "a Letta Cloud feature (templates and projects) this server does not have"
REASONING_IN_SETTINGS = "configure reasoning in model_settings (e.g. reasoning_effort) instead"


def refuse_unsupported(data: Any, unsupported: Mapping[str, str]) -> None:
    """Raise a ValidationError (the API's 422) for each field of `unsupported` that `data` gives a
    value; `unsupported` maps a field to why it is refused."""
    if not isinstance(data, Mapping):
        return
    refused = {
        name: f"not supported: {reason}."
        for name, reason in unsupported.items()
        if data.get(name) not in (None, False, [], {}, "")
    }
    if refused:
        raise serializers.ValidationError(refused)
