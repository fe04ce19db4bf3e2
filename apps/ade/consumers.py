"""WebSocket relay of a run's event stream to the ADE: authenticated, org-checked, resumable from a cursor.

Tokens never travel through the channel layer: the consumer follows the run's Redis Stream through the
process's one reader (apps.streams.hub), from the cursor the browser passes (`?after=<last id seen>`), so
a reconnecting page gets what it missed and then the live tail, with no gap and no duplicate.

Each relay holds one of its user's stream slots (MAX_STREAMS_PER_USER, shared with the API's SSE streams
and blocking sends): past the cap the socket is accepted and closed at once with code 4429 and a reason
(a browser sees neither for a socket refused before it opens); a cursor the stream never sent is closed
the same way with 4400. The relay's subscription and its slot
are given back when the socket closes, whichever side closes it.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from apps.agents.selectors import run_visible_to_user
from apps.api.throttles import STREAM_CLOSE_CODE, StreamSlot, astream_slot, too_many_streams_reason
from apps.streams.events import START
from apps.streams.hub import StreamHub, get_hub

BAD_CURSOR = 4400
UNAUTHORIZED = 4401
NOT_FOUND = 4404
PING_AFTER_S = 15.0
"""Seconds of silence before the relay pings the page."""
CURSOR = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
"""A stream entry id, the only cursor a page is given (`<ms>-<seq>`)."""


@database_sync_to_async
def _run_visible_to(user: Any, run_id: str) -> bool:
    """Existence is not leaked: another organisation's run looks exactly like a missing one."""
    return run_visible_to_user(user=user, run_id=run_id)


class RunStreamConsumer(AsyncWebsocketConsumer):
    relay: asyncio.Task[None] | None = None
    hub: StreamHub | None = None
    slot: StreamSlot | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        run_id = self.scope["url_route"]["kwargs"]["run_id"]
        if user is None or not user.is_authenticated:
            await self.close(code=UNAUTHORIZED)
            return
        if not await _run_visible_to(user, run_id):
            await self.close(code=NOT_FOUND)
            return
        query = parse_qs(self.scope.get("query_string", b"").decode())
        after = (query.get("after") or [START])[0]
        if not CURSOR.fullmatch(after):
            # Accepted first so that the page sees the code (a socket refused before it opens has none).
            await self.accept()
            await self.close(code=BAD_CURSOR, reason="after= must be a cursor this stream sent, such as 0-0.")
            return
        self.hub = get_hub()
        self.slot = await astream_slot(self.hub.commands, str(user.pk))
        await self.accept()
        if self.slot is None:
            await self.close(code=STREAM_CLOSE_CODE, reason=too_many_streams_reason())
            return
        self.relay = asyncio.create_task(self._relay(self.hub, run_id, after))

    async def disconnect(self, code: int) -> None:
        if self.relay is not None:
            self.relay.cancel()
            await asyncio.gather(self.relay, return_exceptions=True)
            self.relay = None
        if self.hub is not None and self.slot is not None:
            await self.slot.arelease(self.hub.commands)

    async def _relay(self, hub: StreamHub, run_id: str, after: str) -> None:
        async with hub.subscribe(run_id, after) as subscription:
            while True:
                if self.slot is not None:
                    await self.slot.arefresh(hub.commands)
                events = await subscription.get(PING_AFTER_S)
                if not events:
                    await self.send(text_data=json.dumps({"type": "ping"}))
                    continue
                for event in events:
                    await self.send(text_data=json.dumps({"cursor": event.cursor, "event": event.data}))
                    if event.is_end:
                        await self.close()
                        return
