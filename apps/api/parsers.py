"""The /v1 JSON parser: DRF's, with a bound on nesting (JSON_MAX_DEPTH).

Without it a body of 100,000 `[` made `json.load` raise RecursionError, a 500; anything a little less deep
parsed, then failed in whatever walked it next (the NUL check, serializers, psycopg's dumps).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from apps.core.jsondepth import nesting_exceeds


def too_deep_message(limit: int) -> str:
    return f"JSON parse error - arrays and objects nest more than {limit} deep (the limit, JSON_MAX_DEPTH)"


class BoundedJSONParser(JSONParser):
    """A body nested deeper than JSON_MAX_DEPTH is a 400 (ParseError), however deep it goes."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = settings.JSON_MAX_DEPTH
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError as exc:  # deeper than the interpreter's stack: json.load gave up
            raise ParseError(too_deep_message(limit)) from exc
        if nesting_exceeds(data, limit):
            raise ParseError(too_deep_message(limit))
        return data
