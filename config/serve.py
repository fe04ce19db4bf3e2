"""The web process: daphne serving config.asgi, with a graceful shutdown on SIGTERM (and SIGINT).

    python -m config.serve -b 0.0.0.0 -p 8283 [any of daphne's options] config.asgi:application

Plain daphne cancels every request at once when it is told to stop: a stream is cut mid-event, a send
loses its answer. Here the first signal starts a drain (later ones are ignored; whoever sent them kills
what overstays):

1. the listening sockets close, so a load balancer's new connections go to the other web processes, and
   /v1/ready answers 503 (apps.core.draining);
2. idle keep-alive connections are closed; the requests in flight get `Connection: close` and their
   connection closes once they are answered; WebSockets are closed with 4503 (SERVER_RESTARTING), and
   the ADE reconnects from its cursor (to another web process, behind a load balancer);
3. requests in flight, SSE streams included, get WEB_SHUTDOWN_TIMEOUT seconds to end: a run that finishes
   meanwhile ends its stream with `data: [DONE]` as usual;
4. what is still open then is closed after its last whole event: that stream ends without `[DONE]`, and
   its client resumes on another web process from the last `seq_id` it read
   (GET /v1/runs/{run_id}/stream?starting_after=N, apps/api/sse.py). The run itself goes on in its
   worker, so nothing of it is lost; a request that was never answered (a blocking send waiting for its
   run) sees its connection close, and its run goes on too.

Then the process exits without waiting for the threads of requests it gave up on (a stream's thread waits
for its next event): their database sessions end with the process, and whatever transaction one had open
is rolled back by PostgreSQL.
"""

from __future__ import annotations

import daphne.server  # isort:skip  (first: installs the asyncio Twisted reactor)

import logging
import os
import signal
import sys
import time
import weakref
from typing import Any

from daphne.cli import CommandLineInterface
from daphne.ws_protocol import WebSocketProtocol
from twisted.internet import reactor as _reactor

logger = logging.getLogger("config.serve")
reactor: Any = _reactor  # zope interfaces, which mypy reads without their `self`

POLL_S = 0.1
CLOSE_GRACE_S = 2.0
"""After the connections still open at the deadline are closed: how long their last bytes may take to go out
before the reactor stops (stopping drops whatever a connection has not sent yet)."""
SERVER_RESTARTING = 4503
"""The WebSocket close code of a draining server: 4000 + HTTP 503, beside the ADE's 4401, 4404 and 4429
(autobahn lets a server send only 1000 or 3000-4999, so not the registry's 1012). The ADE reconnects from
its cursor on any code but those three."""


class DrainingServer(daphne.server.Server):
    """daphne's Server, stopping as the module docstring says."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.signal_handlers = False  # ours, installed once the reactor runs (run())
        self.ports: list[Any] = []
        self.channels: weakref.WeakSet[Any] = weakref.WeakSet()
        self.drain_started: float | None = None
        self.timeout = 10.0

    def run(self) -> None:
        reactor.callWhenRunning(self._install_signal_handlers)
        super().run()

    def _install_signal_handlers(self) -> None:
        loop = reactor._asyncioEventloop
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.drain, signum)

    def listen_success(self, port: Any) -> None:
        self.ports.append(port)
        super().listen_success(port)

    def protocol_connected(self, protocol: Any) -> None:
        """Every HTTP request and WebSocket registers here; their connections are what a drain closes."""
        super().protocol_connected(protocol)
        channel = getattr(protocol, "channel", None)
        if channel is not None:
            self.channels.add(channel)
            if self.drain_started is not None:
                channel.persistent = False

    async def handle_reply(self, protocol: Any, message: dict[str, Any]) -> None:
        if self.drain_started is not None and message.get("type") == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
        await super().handle_reply(protocol, message)

    def drain(self, signum: int = signal.SIGTERM) -> None:
        """Steps 1 and 2 of the module docstring, then wait (step 3)."""
        if self.drain_started is not None:
            return
        from django.conf import settings

        from apps.core import draining

        self.drain_started = time.monotonic()
        self.timeout = float(settings.WEB_SHUTDOWN_TIMEOUT)
        draining.begin()
        for port in self.ports:
            _never_fail(port.stopListening)
        for channel in list(self.channels):
            if getattr(channel, "requests", None):
                channel.persistent = False  # closes once its current request is answered
            else:
                _never_fail(channel.loseConnection)
        for protocol in list(self.connections):
            if isinstance(protocol, WebSocketProtocol):
                _never_fail(protocol.serverClose, code=SERVER_RESTARTING)
        logger.info(
            "web.draining signal=%s requests=%d timeout=%.0fs",
            signal.Signals(signum).name,
            len(self.requests_in_flight()),
            self.timeout,
        )
        self._wait()

    def requests_in_flight(self) -> list[Any]:
        """HTTP requests not yet answered in full (streams included)."""
        return [
            protocol
            for protocol, details in self.connections.items()
            if not isinstance(protocol, WebSocketProtocol) and "disconnected" not in details
        ]

    def _wait(self) -> None:
        assert self.drain_started is not None
        waiting = self.requests_in_flight()
        if waiting and time.monotonic() - self.drain_started < self.timeout:
            reactor.callLater(POLL_S, self._wait)
            return
        for protocol in waiting:  # step 4: closed after what was written (whole SSE events) is sent
            channel = getattr(protocol, "channel", None)
            if channel is not None:
                channel.loseConnection()
        logger.info(
            "web.drained after=%.1fs cut=%d",
            time.monotonic() - self.drain_started,
            len(waiting),
        )
        self._stop_when_sent(time.monotonic() + (CLOSE_GRACE_S if waiting else 0.0))

    def _stop_when_sent(self, deadline: float) -> None:
        open_connections = [p for p, details in self.connections.items() if "disconnected" not in details]
        if open_connections and time.monotonic() < deadline:
            reactor.callLater(POLL_S, self._stop_when_sent, deadline)
            return
        self.stop()

    def kill_all_applications(self) -> None:
        """Cancel what is left without waiting for it (daphne waits, and a stream's thread blocks until
        its next event); the process exits right after (main())."""
        for details in self.connections.values():
            application = details.get("application_instance")
            if application is not None and not application.done():
                application.cancel()


def _never_fail(action: Any, *args: Any, **kwargs: Any) -> None:
    """One connection's close: a failure is logged, and the drain goes on with the others."""
    try:
        action(*args, **kwargs)
    except Exception:
        logger.exception("web.drain_close_failed")


class ServeCommand(CommandLineInterface):
    server_class = DrainingServer


def main(argv: list[str]) -> int:
    ServeCommand().run(argv)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    logging.shutdown()
    # Not a normal interpreter exit: that would join the threads of the requests given up on.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
