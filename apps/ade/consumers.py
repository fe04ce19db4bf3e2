"""WebSocket relay of a run's event stream to the ADE: authenticated, org-checked, resumable from a cursor.

Tokens never travel through the channel layer: the consumer reads the run's Redis Stream itself
(apps.streams.events), from the cursor the browser passes (`?after=<last id seen>`), so a reconnecting
page gets what it missed and then the live tail, with no gap and no duplicate.

Each relay holds one of its user's stream slots (MAX_STREAMS_PER_USER, shared with the API's SSE streams
and blocking sends): past the cap the socket is accepted and closed at once with code 4429 and a reason
(a browser sees neither for a socket refused before it opens). The relay's Redis client and its slot
are given back when the socket closes, whichever side closes it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from apps.agents.selectors import run_visible_to_user
from apps.api.throttles import STREAM_CLOSE_CODE, StreamSlot, astream_slot, too_many_streams_reason
from apps.streams.events import END_EVENT, START, stream_key
from apps.streams.redis_client import get_async_redis

UNAUTHORIZED = 4401
NOT_FOUND = 4404


@database_sync_to_async
def _run_visible_to(user: Any, run_id: str) -> bool:
    """Existence is not leaked: another organisation's run looks exactly like a missing one."""
    return run_visible_to_user(user=user, run_id=run_id)


class RunStreamConsumer(AsyncWebsocketConsumer):
    relay: asyncio.Task[None] | None = None
    redis: Any = None
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
        self.redis = get_async_redis()
        self.slot = await astream_slot(self.redis, str(user.pk))
        await self.accept()
        if self.slot is None:
            await self.close(code=STREAM_CLOSE_CODE, reason=too_many_streams_reason())
            return
        self.relay = asyncio.create_task(self._relay(run_id, after))

    async def disconnect(self, code: int) -> None:
        if self.relay is not None:
            self.relay.cancel()
            await asyncio.gather(self.relay, return_exceptions=True)
            self.relay = None
        if self.redis is not None:
            try:
                if self.slot is not None:
                    await self.slot.arelease(self.redis)
            finally:
                await self.redis.aclose()
                self.redis = None

    async def _relay(self, run_id: str, after: str) -> None:
        client = self.redis
        cursor = after
        while True:
            if self.slot is not None:
                await self.slot.arefresh(client)
            reply = await client.xread({stream_key(run_id): cursor}, count=200, block=15_000)
            if not reply:
                await self.send(text_data=json.dumps({"type": "ping"}))
                continue
            for entry_id, fields in reply[0][1]:
                cursor = entry_id
                event = json.loads(fields["data"])
                await self.send(text_data=json.dumps({"cursor": entry_id, "event": event}))
                if event.get("message_type") == END_EVENT:
                    await self.close()
                    return
