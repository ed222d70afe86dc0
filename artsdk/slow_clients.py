"""A deadline on each request's headers for the uvicorn servers (the backends' and the
viewer's): a client that trickles its headers, or connects and sends nothing, cannot hold a
connection. And how long an idle connection is kept (``KEEP_ALIVE``), for the same servers."""

from __future__ import annotations

import asyncio
from typing import Optional

from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT = 10.0  # seconds from the first byte of a request to the end of its headers
# seconds an idle connection is kept open: longer than clients keep theirs (httpx, and so the
# openai client, 5 s), so a client never reuses one just as the server closes it. uvicorn's
# default, 5 s, raced httpx's: now and then a request went into a closing connection and the
# client saw "Server disconnected without sending a response".
KEEP_ALIVE = 75


class GuardedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline on each request's headers: a connection
    that has not sent complete headers ``HEADER_TIMEOUT`` seconds after its first byte (or
    after connecting) is closed."""

    header_timeout = HEADER_TIMEOUT

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: Optional[asyncio.TimerHandle] = None
        self._arm()

    def _arm(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def data_received(self, data: bytes) -> None:
        between_requests = self.cycle is None or self.cycle.response_complete
        if self._header_timer is None and between_requests:
            self._arm()  # a new request starts: its headers are on the clock
        super().data_received(data)
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # its headers are in

    def on_response_complete(self) -> None:
        self._disarm()
        super().on_response_complete()

    def _too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._disarm()
        super().connection_lost(exc)
