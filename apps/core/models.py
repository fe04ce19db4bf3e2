"""Abstract base models shared by every app."""

from __future__ import annotations

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
