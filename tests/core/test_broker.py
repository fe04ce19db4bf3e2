"""Celery's broker transport (config/broker.py) and configuration source (config/celery.py), through the real
Redis the tests use."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
import redis
from django.conf import settings

from config.broker import Channel, Transport
from config.celery import DjangoCelerySettings, app


@pytest.fixture
def queue() -> Iterator[str]:
    name = f"test-broker-{uuid.uuid4().hex}"
    yield name
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(name)


@contextmanager
def clients_made_here() -> Iterator[list[int]]:
    """The redis.Redis clients this thread makes meanwhile (the real constructor still runs)."""
    made: list[int] = []
    real = redis.Redis.__init__

    def counting(self: redis.Redis, *args: Any, **kwargs: Any) -> None:
        if threading.get_ident() == here:
            made.append(id(self))
        real(self, *args, **kwargs)

    here = threading.get_ident()
    with mock.patch.object(redis.Redis, "__init__", counting):
        yield made


def test_task_publishes_reuse_one_redis_client_and_every_message_arrives(queue: str) -> None:
    with app.connection_for_write() as connection:
        assert isinstance(connection.transport, Transport)
    app.send_task("tests.broker.noop", args=["warm"], queue=queue)
    with clients_made_here() as made:
        for i in range(20):
            app.send_task("tests.broker.noop", args=[i], queue=queue)
    assert made == []  # kombu's own channel made a client for each of the 20
    assert redis.Redis.from_url(settings.CELERY_BROKER_URL).llen(queue) == 21


def test_a_channel_whose_pool_was_replaced_gets_a_client_on_the_new_pool(queue: str) -> None:
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        assert isinstance(channel, Channel)
        with channel.conn_or_acquire() as first:
            first.lpush(queue, b"1")
        channel._disconnect_pools()  # what kombu does after a connection error
        with channel.conn_or_acquire() as second:
            second.lpush(queue, b"2")
        assert second is not first
        assert second.connection_pool is channel.pool
        with channel.conn_or_acquire() as third:
            assert third is second
    assert redis.Redis.from_url(settings.CELERY_BROKER_URL).llen(queue) == 2


def test_celery_reads_djangos_celery_settings_and_its_own_defaults() -> None:
    source = DjangoCelerySettings()
    assert source["CELERY_BROKER_URL"] == settings.CELERY_BROKER_URL
    assert "DATABASES" not in source
    assert app.conf.broker_url == settings.CELERY_BROKER_URL
    assert app.conf.task_acks_late is settings.CELERY_TASK_ACKS_LATE is True
    assert app.conf.worker_prefetch_multiplier == settings.CELERY_WORKER_PREFETCH_MULTIPLIER
    assert app.conf.broker_transport_options == settings.CELERY_BROKER_TRANSPORT_OPTIONS
    assert app.conf.beat_schedule == settings.CELERY_BEAT_SCHEDULE
    assert app.conf.task_default_queue == "celery"  # not set: Celery's default
