"""Abstract base models shared by every app."""

from __future__ import annotations

import zlib
from typing import Any

from django.contrib.postgres.fields import ArrayField
from django.db import models

from apps.core.tenancy import OrgScopedManager


class TimestampedModel(models.Model):
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class OrgOwnedModel(TimestampedModel):
    """A row that belongs to exactly one organisation. Query it through `objects.for_actor()`."""

    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="+")

    # Declared first so it is the default manager Django's internals use (see apps.core.tenancy).
    all_objects = models.Manager()
    objects = OrgScopedManager()

    class Meta:
        abstract = True


class IdArrayField(ArrayField):
    """An array of platform-made ids (`<prefix>-<uuid>`, never a comma), read as one comma-joined text that
    Python splits: psycopg parsing the elements of a 50-agent page's in-context ids (4,500 of them) was
    1.1 ms of the page's 1.8 ms in the database driver (bench/scale_bench.py). Stored, written and filtered
    as the array it is; only the select list reads it joined. A hand-written read (apps.core.db.RowReader)
    gets the array and keeps it."""

    def select_format(self, compiler: Any, sql: str, params: Any) -> tuple[str, Any]:
        sql, params = super().select_format(compiler, sql, params)
        return f"array_to_string({sql}, ',')", params

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> list[str] | None:
        if isinstance(value, str):
            return value.split(",") if value else []
        return value


class CompressedTextField(models.BinaryField):
    """Text stored zlib-compressed (level 1) as bytea, read back as text: for large documents written on
    a hot path and read rarely (an LLM call's request and response: the whole context, tens to hundreds of
    KB a call). PostgreSQL would otherwise compress the text itself with pglz on every insert, several
    times the CPU of zlib's fastest level for a larger result (bench/RESULTS.md, 2026-12-07); bytes that
    are compressed already it stores as they are. Rows written as text before the column was compressed
    (their migration keeps them as UTF-8 bytes) read back the same."""

    # What django-stubs' plugin gives the model attribute: text, as from_db_value makes it.
    _pyi_private_set_type: str
    _pyi_private_get_type: str  # type: ignore[assignment]

    def _check_str_default_value(self) -> list[Any]:
        return []  # a text default is right here: the value is text

    def get_prep_value(self, value: Any) -> Any:
        value = super().get_prep_value(value)
        if isinstance(value, str):
            return zlib.compress(value.encode(), 1) if value else b""
        return value

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> str | None:
        return None if value is None else compressed_text(value)

    def to_python(self, value: Any) -> Any:
        if isinstance(value, (bytes, memoryview)):
            return compressed_text(value)
        return value  # text already (BinaryField would read a str as base64)

    def value_to_string(self, obj: models.Model) -> str:
        return str(self.value_from_object(obj) or "")


def compressed_text(data: bytes | memoryview) -> str:
    """The text of a CompressedTextField's bytes: zlib's stream, or (written before compression) UTF-8."""
    raw = bytes(data)
    if raw[:1] == b"\x78":  # zlib's header byte (deflate, 32 KiB window); JSON text never starts with "x"
        try:
            return zlib.decompress(raw).decode()
        except zlib.error:
            pass
    return raw.decode()
