"""The API's JSON renderer (orjson) writes what DRF's JSONRenderer writes, byte for byte, for the values
the two could encode differently; what orjson refuses is rendered by DRF."""

import datetime
import decimal
import uuid

from django.utils.translation import gettext_lazy
from rest_framework.renderers import JSONRenderer

from apps.api.renderers import OrjsonRenderer


def test_the_renderer_writes_what_drf_writes():
    moment = datetime.datetime(2026, 12, 4, 1, 2, 3, 456789, tzinfo=datetime.UTC)
    data = {
        "when": moment,
        "day": moment.date(),
        "naive": datetime.datetime(2026, 12, 4, 1, 2, 3),
        "price": decimal.Decimal("1.10"),
        "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "lazy": gettext_lazy("Not found."),
        "separators": "a\u2028b\u2029c",
        "text": 'Grüße, 東京 "quoted" \\ \n',
        "numbers": [1, -2, 3.5, 1e300, True, None],
        7: "an int key",
        "nested": [{"t": (1, 2)}, []],
    }

    assert OrjsonRenderer().render(data) == JSONRenderer().render(data)


def test_what_orjson_refuses_is_rendered_by_drf():
    data = {"huge": 2**70}

    assert OrjsonRenderer().render(data) == JSONRenderer().render(data) == b'{"huge":1180591620717411303424}'
    assert OrjsonRenderer().render(None) == b""
