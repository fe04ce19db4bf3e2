"""A database session whose peer is gone ends within DATABASE_TCP_TIMEOUT on both sides, so a partitioned
worker's conversation locks are released (issue 24). The partition itself is exercised by the cluster
tests; here: every session the platform opens asks for the bound, client side and server side."""

import pytest
from django.conf import settings
from django.db import connection

pytestmark = pytest.mark.django_db


def test_each_session_bounds_how_long_a_dead_peer_keeps_it_alive():
    timeout = settings.DATABASE_TCP_TIMEOUT
    assert timeout > 0

    connection.ensure_connection()
    client = connection.connection.info.get_parameters()
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, source FROM pg_settings WHERE name LIKE 'tcp_%%'")
        server = dict(cursor.fetchall())

    assert client["keepalives"] == "1"
    assert client["tcp_user_timeout"] == str(timeout * 1000)
    idle, interval, count = (
        int(client[k]) for k in ("keepalives_idle", "keepalives_interval", "keepalives_count")
    )
    assert idle + interval * count <= timeout
    # Set for this session by the client (the value reads 0 over the embedded server's Unix socket).
    assert {
        server[name]
        for name in (
            "tcp_keepalives_idle",
            "tcp_keepalives_interval",
            "tcp_keepalives_count",
            "tcp_user_timeout",
        )
    } == {"client"}
