"""The API's JSON renderer: DRF's JSONRenderer, encoded by orjson.

json.dumps took about 2 ms of a 50-agent page (330 KB, bench/scale_bench.py); orjson encodes the same in a
fraction. What orjson would encode differently from DRF (datetimes: DRF writes milliseconds and `Z`;
decimals, lazy translation strings, UUIDs, dataclasses) goes through DRF's own encoder, and a value orjson
refuses outright (an integer past 64 bits) has the whole response rendered by DRF instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.encoders import JSONEncoder

_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_NON_STR_KEYS
_LINE_SEPARATORS = (b"\xe2\x80\xa8", b"\xe2\x80\xa9")  # U+2028, U+2029: DRF escapes them, as JavaScript needs


class OrjsonRenderer(JSONRenderer):
    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        if data is None:
            return b""
        if self.get_indent(accepted_media_type or "", renderer_context or {}):
            return super().render(data, accepted_media_type, renderer_context)  # asked to be pretty
        try:
            rendered = orjson.dumps(data, default=JSONEncoder().default, option=_OPTIONS)
        except orjson.JSONEncodeError:
            return super().render(data, accepted_media_type, renderer_context)
        if _LINE_SEPARATORS[0] in rendered or _LINE_SEPARATORS[1] in rendered:
            rendered = rendered.replace(_LINE_SEPARATORS[0], b"\\u2028").replace(
                _LINE_SEPARATORS[1], b"\\u2029"
            )
        return rendered
