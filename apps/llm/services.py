"""Writes of the llm app: an organisation's provider credentials (Letta's BYOK providers).

Keys are write-only: they are stored encrypted (apps.core.crypto) and no read path hands them back to
a person; only apps.llm.handles decrypts them to make a call.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from django.db import IntegrityError, transaction

from apps.core import permissions
from apps.core.actor import Actor
from apps.core.errors import Conflict, InvalidInput
from apps.core.outbound import check_url
from apps.core.permissions import Action
from apps.llm.models import Provider
from apps.llm.selectors import provider_get, provider_missing

PROVIDER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
"""A handle prefix: `<name>/<model>`, so no '/' and nothing a person could misread."""


def _require_manage(actor: Actor) -> None:
    permissions.require(actor, Action.PROVIDER_MANAGE)


def check_base_url(url: str) -> None:
    """http(s) with a host the outbound guard lets tenants reach (apps.core.outbound: public addresses;
    a model server on the same machine or network only when the operator allows it, OUTBOUND_ALLOW).
    Raises InvalidInput (OutboundRefused) with the reason."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise InvalidInput(f"The base URL is not a valid URL: '{url}'.") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in url:
        raise InvalidInput(f"The base URL must be an http:// or https:// URL, got '{url}'.")
    check_url(url, what="The base URL")


@transaction.atomic
def provider_create(
    *, actor: Actor, name: str, provider_type: str, api_key: str = "", base_url: str = ""
) -> Provider:
    """Add a provider credential to the actor's organisation (owners and admins only).

    Raises PermissionDenied, InvalidInput (bad name, type or URL; a type's required key or URL missing)
    and Conflict (the organisation already has a provider of that name).
    """
    _require_manage(actor)
    name, api_key, base_url = name.strip(), api_key.strip(), base_url.strip()
    if provider_type not in Provider.Type.values:
        raise InvalidInput(f"Choose a provider type ({', '.join(Provider.Type.values)}).")
    if not PROVIDER_NAME.match(name):
        raise InvalidInput(
            "The name is the handle prefix (as in 'openai/gpt-4o-mini'): use letters, digits, '-', '_' "
            "or '.', at most 100 characters, without '/'."
        )
    if base_url:
        check_base_url(base_url)
    missing = provider_missing(provider_type=provider_type, api_key=api_key, base_url=base_url)
    if missing:
        raise InvalidInput(f"{Provider.Type(provider_type).label} providers need {missing}.")
    providers = Provider.objects.for_actor(actor)
    if providers.filter(name=name).exists():
        raise Conflict(
            f"This organization already has a provider named '{name}'; delete it first to replace it."
        )
    try:
        with transaction.atomic():
            return providers.create(
                name=name, provider_type=provider_type, api_key=api_key, base_url=base_url
            )
    except IntegrityError as exc:  # created concurrently under the same name
        raise Conflict(f"This organization already has a provider named '{name}'.") from exc


@transaction.atomic
def provider_delete(*, actor: Actor, provider_id: str) -> Provider:
    """Remove a provider credential (owners and admins only). Agents whose handles named it stop
    resolving until a provider of that name exists again (or the deployment serves the name).
    Raises PermissionDenied, NotFound."""
    _require_manage(actor)
    provider = provider_get(actor=actor, provider_id=provider_id)
    provider.delete()
    return provider
