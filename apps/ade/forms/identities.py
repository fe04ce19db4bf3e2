"""Forms of the identity pages: an identity's fields, one property, an agent to link."""

from __future__ import annotations

import json
from typing import Any

from django import forms

from apps.ade.forms.base import AdeForm, text_field
from apps.identities.models import IdentityType, PropertyType


class IdentityForm(AdeForm):
    """The service checks lengths and refuses a taken identifier_key (Letta's 409)."""

    identifier_key = forms.CharField(error_messages={"required": "Give the identity your app's key for it."})
    name = forms.CharField(error_messages={"required": "Give the identity a name."})
    identity_type = forms.ChoiceField(choices=IdentityType.choices)


class PropertyForm(AdeForm):
    """One property, its value typed as `type` says (Letta's IdentityProperty): a number, true/false, or a
    JSON object."""

    key = forms.CharField(error_messages={"required": "Give the property a key."})
    type = forms.ChoiceField(choices=PropertyType.choices)
    value = text_field(strip=False)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        kind, raw = data.get("type"), (data.get("value") or "").strip()
        if kind is None:
            return data
        try:
            data["typed_value"] = _typed(kind, raw, data.get("value") or "")
        except ValueError as exc:
            self.add_error("value", str(exc))
        return data


def _typed(kind: str, raw: str, text: str) -> Any:
    if kind == PropertyType.NUMBER:
        try:
            number = float(raw)
        except ValueError:
            raise ValueError("A number property needs a number, such as 42 or 3.5.") from None
        return int(number) if number.is_integer() and "." not in raw and "e" not in raw.lower() else number
    if kind == PropertyType.BOOLEAN:
        if raw.lower() not in ("true", "false"):
            raise ValueError("A boolean property is true or false.")
        return raw.lower() == "true"
    if kind == PropertyType.JSON:
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            raise ValueError('A JSON property needs a JSON object, such as {"plan": "pro"}.') from None
        if not isinstance(value, dict):
            raise ValueError('A JSON property needs a JSON object, such as {"plan": "pro"}.')
        return value
    return text


class AgentLinkForm(AdeForm):
    agent = forms.CharField(error_messages={"required": "Choose an agent to link."})
