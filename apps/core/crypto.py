"""Encryption at rest for secrets (provider keys, sandbox and agent env vars).

Keys come from SECRETS_ENCRYPTION_KEY: comma-separated Fernet keys, the first encrypts, all decrypt,
so keys can be rotated without downtime (re-save rows to re-encrypt with the new key).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import models

ENCRYPTED_PREFIX = "fernet:"


@cache
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    if not keys:
        raise ImproperlyConfigured(
            "SECRETS_ENCRYPTION_KEY is not set; generate one with "
            "`python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'`"
        )
    return MultiFernet([Fernet(k.encode()) for k in keys])


def _keys() -> tuple[str, ...]:
    return tuple(settings.SECRETS_ENCRYPTION_KEYS)


def encrypt(plaintext: str) -> str:
    return ENCRYPTED_PREFIX + _fernet(_keys()).encrypt(plaintext.encode()).decode()


def decrypt(stored: str) -> str:
    if not stored.startswith(ENCRYPTED_PREFIX):
        raise ValueError("value is not an encrypted secret")
    try:
        return _fernet(_keys()).decrypt(stored[len(ENCRYPTED_PREFIX) :].encode()).decode()
    except InvalidToken as exc:
        raise ImproperlyConfigured("a stored secret cannot be decrypted with SECRETS_ENCRYPTION_KEY") from exc


class EncryptedTextField(models.TextField):
    """A text column holding a Fernet token; Python code sees plaintext, the database never does."""

    def from_db_value(self, value: str | None, expression: Any, connection: Any) -> str | None:
        if not value:  # NULL and "" are stored as they are: there is no secret to hide
            return value
        return decrypt(value)

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str) and value.startswith(ENCRYPTED_PREFIX):
            return decrypt(value)
        return value

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        if value is None or value == "":
            return value
        return encrypt(value)
