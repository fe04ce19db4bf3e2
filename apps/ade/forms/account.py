"""Forms of the settings pages, the organisation switcher and the invitation page."""

from __future__ import annotations

from django import forms

from apps.ade.forms.base import AdeForm, text_field

API_KEY_NAME_MAX = 200


class ProviderForm(AdeForm):
    """An LLM provider; the service checks the type, the name and the base URL. The key is read once and
    never shown again, not even when the form is refused: `values()` leaves it out."""

    provider_type = text_field()
    name = text_field()
    base_url = text_field()
    api_key = text_field(strip=False)

    def values(self) -> dict[str, str]:
        values = super().values()
        del values["api_key"]
        return values


class ApiKeyForm(AdeForm):
    name = forms.CharField(
        max_length=API_KEY_NAME_MAX,
        error_messages={
            "required": "Give the key a name (at most 200 characters), e.g. where it will be used.",
            "max_length": "Give the key a name (at most 200 characters), e.g. where it will be used.",
        },
    )


class InvitationForm(AdeForm):
    role = text_field()
    note = text_field()


class MemberRoleForm(AdeForm):
    role = text_field(strip=False)


class OrganizationSwitchForm(AdeForm):
    organization_id = text_field(strip=False)
    next = text_field(strip=False)


class JoinForm(AdeForm):
    """Accepting an invitation as a new account; the service validates the username and the password."""

    username = text_field()
    password = text_field(strip=False)
