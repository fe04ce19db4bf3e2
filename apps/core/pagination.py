"""Letta-style cursor pagination: before/after are ids, limit caps the page, order is asc or desc.

Cursors compare (created_at, id) in the chosen order, so `after` always moves forward and a page past
the end is empty: the SDK's auto-pagination stops only on an empty page.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q, QuerySet

from apps.core.errors import InvalidInput

MAX_LIMIT = 1000


@dataclass(frozen=True)
class PageParams:
    before: str | None = None
    after: str | None = None
    limit: int = 50
    order: str = "desc"

    @classmethod
    def from_query(cls, params: dict[str, str] | object, *, default_limit: int = 50) -> PageParams:
        get = params.get
        order = get("order") or "desc"
        if order not in ("asc", "desc"):
            raise InvalidInput("order must be 'asc' or 'desc'")
        raw_limit = get("limit")
        try:
            limit = default_limit if raw_limit in (None, "") else int(raw_limit)
        except ValueError as exc:
            raise InvalidInput("limit must be an integer") from exc
        if limit < 1:
            raise InvalidInput("limit must be at least 1")
        return cls(
            before=get("before") or None, after=get("after") or None, limit=min(limit, MAX_LIMIT), order=order
        )


def _cursor_filter(qs: QuerySet, cursor_id: str, *, forward: bool, key: str) -> Q | None:
    """Looked up in the listing's own (scoped) queryset: a cursor the caller cannot see is unknown, so a
    page never tells whether another organisation's id exists."""
    row = qs.filter(id=cursor_id).order_by().values(key, "id").first()
    if row is None:
        return None
    after = "gt" if forward else "lt"
    # The leading bound is implied by the OR, but only with it can an index on `key` start at the cursor
    # instead of walking every row before it (a page 5,000 agents deep read 5,000 index entries).
    return Q(**{f"{key}__{after}e": row[key]}) & (
        Q(**{f"{key}__{after}": row[key]}) | Q(**{key: row[key], f"id__{after}": row["id"]})
    )


def paginate(qs: QuerySet, page: PageParams, *, key: str = "created_at") -> list:
    """Apply the cursors and limit, ordered by `key` then id (`key` must never be NULL: annotate a
    nullable column with a Coalesce first). An unknown cursor id yields an empty page rather than
    restarting."""
    ascending = page.order == "asc"
    for cursor, later in ((page.after, True), (page.before, False)):
        if cursor is None:
            continue
        # "after" means later in the chosen order: newer when ascending, older when descending.
        condition = _cursor_filter(qs, cursor, forward=later == ascending, key=key)
        if condition is None:
            return []
        qs = qs.filter(condition)
    ordering = (key, "id") if ascending else (f"-{key}", "-id")
    return list(qs.order_by(*ordering)[: page.limit])
