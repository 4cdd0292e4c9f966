"""A lean HTTP/1.1 client for the open-loop benchmark client: a keep-alive connection pool on
asyncio protocols, one request at a time per connection, the answer's body kept as the raw
pieces that arrived, each with the time of the read that brought it.

Why not aiohttp or httpx: their per-request work (request and response objects, header
multidicts, stream readers, per-line callbacks) cost 0.4-0.6 ms of CPU per streamed request,
which on a 2-core machine capped the client near 500 requests/s, and every read they delay
shows up as latency the server did not add. Here the hot path is: one ``write`` per request,
and per network read one clock reading and one list append (plus the chunked framing);
what the body means (SSE events, JSON) is parsed by the caller once the answer is complete.

What it speaks: ``http`` and ``https`` (TLS through asyncio), ``Content-Length``,
``Transfer-Encoding: chunked`` and close-delimited bodies, ``Connection: close``. No
redirects, proxies or compression (the request says ``Accept-Encoding: identity``). A
connection that the server closed while it sat idle in the pool is retried once on a new
connection when not a byte of the answer came back.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import cast
from urllib.parse import urlsplit

HEAD, LENGTH, CHUNKED, TRAILER, UNTIL_CLOSE, DONE = range(6)
MAX_HEAD_BYTES = 65536
# the most of one answer that is kept: a streamed LLM answer takes ~300 bytes a token (usage
# on every chunk), so 64 MiB is ~200k tokens, a request-level answer a few KiB to MiB; a
# server that sends more (an endless body, a Content-Length of gigabytes) has the request
# failed and its connection closed instead of filling the client's memory
MAX_ANSWER_BYTES = 64 * 2**20
# the most that the answers in flight on one pool (one run's requests) hold together: the
# per-answer cap alone let 1,000 requests streaming 60 MiB each hold 60 GB. 512 MiB is 8
# answers at that cap, and with a plan under the commands' 4 GiB budget keeps a bench
# within it. Fixed rather than derived from the memory free at the time, so that which
# requests fail does not depend on what else the machine was doing. An answer whose next
# read would take the pool past it is cut (:class:`PoolFullError`) and its bytes returned;
# the others go on.
MAX_POOLED_ANSWER_BYTES = 512 * 2**20
CONNECT_TIMEOUT_S = 10.0


class ConnectError(Exception):
    """The connection could not be opened (refused, unreachable, TLS failure)."""


class CutError(Exception):
    """The connection ended, or sent bytes that are not HTTP, before the answer was complete."""


class PoolFullError(CutError):
    """The answers in flight on the pool would hold more than its budget with this read: the
    answer is cut (:data:`MAX_POOLED_ANSWER_BYTES`).
    """


class AnswerBudget:
    """The bytes that the answers in flight on one :class:`Pool` hold together: ``held``
    (charged as reads arrive, returned by :meth:`Reply.release`), at most ``limit``;
    ``peak``: the most held at once.
    """

    __slots__ = ("held", "limit", "peak")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0


class Reply:
    """One answer as it arrives: status, reason, whether the connection stays open, and the
    body as ``pieces`` of ``(arrival_s, bytes)`` (``time.perf_counter`` seconds).
    """

    __slots__ = ("_buf", "_left", "_mode", "budget", "charged", "keep_alive", "pieces",
                 "reason", "received", "status")

    def __init__(self) -> None:
        self.status = 0
        self.reason = ""
        self.keep_alive = True
        self.pieces: list[tuple[float, bytes]] = []
        self.received = 0  # bytes of the answer (head included) that came back
        self._mode = HEAD
        self._buf = b""
        self._left = 0
        self.budget: AnswerBudget | None = None  # the pool's, set by Pool.post
        self.charged = 0  # bytes of the budget this answer holds

    def release(self) -> None:
        """Return this answer's bytes to its pool's budget (its sender is done with the
        body); later reads are no longer charged.
        """
        if self.budget is not None:
            self.budget.held -= self.charged
            self.charged, self.budget = 0, None

    @property
    def complete(self) -> bool:
        """The whole answer came."""
        return self._mode == DONE

    def body(self) -> bytes:
        """The body received so far, joined."""
        return b"".join(p for _, p in self.pieces)

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            raise CutError(f"not an HTTP status line: {lines[0][:60]!r}")
        self.status = int(parts[1])
        self.reason = parts[2].decode("latin-1") if len(parts) > 2 else ""
        self.keep_alive = parts[0] != b"HTTP/1.0"
        length = -1
        chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            key = name.strip().lower()
            if key == b"content-length":
                length = int(value.strip())
                if length > MAX_ANSWER_BYTES:
                    raise CutError(f"the answer's Content-Length {length} is over "
                                   f"{MAX_ANSWER_BYTES // 2**20} MiB; not read")
            elif key == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif key == b"connection":
                low = value.strip().lower()
                if low == b"close":
                    self.keep_alive = False
                elif low == b"keep-alive":
                    self.keep_alive = True
        if chunked:
            self._mode = CHUNKED
        elif length >= 0:
            self._mode, self._left = LENGTH, length
        elif self.status in (204, 304) or 100 <= self.status < 200:
            self._mode = DONE
        else:
            self._mode, self.keep_alive = UNTIL_CLOSE, False

    def feed(self, data: bytes, now: float) -> bool:
        """Take one read's bytes; True when the answer is complete.

        Raises:
            CutError: the bytes are not an HTTP answer.
        """
        self.received += len(data)
        if self.received > MAX_ANSWER_BYTES:
            raise CutError(f"the answer is longer than {MAX_ANSWER_BYTES // 2**20} MiB; "
                           "stopped reading it")
        budget = self.budget
        if budget is not None:
            if budget.held + len(data) > budget.limit:  # this read is dropped, not kept
                raise PoolFullError(
                    f"the answers in flight hold {budget.held / 2**20:.0f} MiB and this "
                    f"one's next {len(data)} bytes would pass the client's "
                    f"{budget.limit // 2**20} MiB for all answers; stopped reading it")
            budget.held += len(data)
            self.charged += len(data)
            budget.peak = max(budget.peak, budget.held)
        if self._mode == HEAD:
            buf = self._buf + data
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise CutError("the answer's head is longer than 64 KiB")
                self._buf = buf
                return False
            self._buf = b""
            try:
                self._head(buf[:end])
            except ValueError:
                raise CutError(f"a bad HTTP head: {buf[:60]!r}") from None
            data = buf[end + 4:]
            if self._mode == LENGTH and self._left == 0:
                self._mode = DONE
            if self._mode == DONE or not data:
                return self._mode == DONE
        if self._mode == LENGTH:
            take = data[:self._left]
            self.pieces.append((now, take))
            self._left -= len(take)
            if self._left == 0:
                self._mode = DONE
                return True
            return False
        if self._mode == UNTIL_CLOSE:
            self.pieces.append((now, data))
            return False
        if self._mode == DONE:
            return True
        return self._chunked(data, now)

    def _chunked(self, data: bytes, now: float) -> bool:
        buf = self._buf + data if self._buf else data
        self._buf = b""
        pos, n = 0, len(buf)
        while True:
            if self._mode == TRAILER:
                if buf.startswith(b"\r\n", pos):
                    self._mode = DONE
                    return True
                end = buf.find(b"\r\n\r\n", pos)
                if end < 0:
                    self._buf = buf[pos:]
                    return False
                self._mode = DONE
                return True
            if self._left > 0:  # inside a chunk's data
                take = min(self._left, n - pos)
                if take:
                    self.pieces.append((now, buf[pos:pos + take]))
                    pos += take
                    self._left -= take
                if self._left > 0:
                    return False
                self._left = -1  # its CRLF next
            if self._left == -1:
                if n - pos < 2:
                    self._buf = buf[pos:]
                    return False
                pos += 2
                self._left = 0
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if n - pos > 1024:
                    raise CutError("a chunk-size line longer than 1 KiB")
                self._buf = buf[pos:]
                return False
            try:
                size = int(buf[pos:eol].split(b";", 1)[0], 16)
            except ValueError:
                raise CutError(f"a bad chunk size: {buf[pos:eol][:40]!r}") from None
            pos = eol + 2
            if size == 0:
                self._mode = TRAILER
            else:
                self._left = size

    def lost(self) -> bool:
        """The connection ended: True when that completes the answer (a close-delimited
        body), False when the answer was cut.
        """
        if self._mode == UNTIL_CLOSE:
            self._mode = DONE
        return self._mode == DONE


class _Conn(asyncio.Protocol):
    """One connection; at most one request in flight on it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reply: Reply | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport."""
        self.transport = cast(asyncio.Transport, transport)  # uvloop's: not a subclass

    def data_received(self, data: bytes) -> None:
        """Feed the answer; wake the request when it is complete."""
        reply = self.reply
        if reply is None:  # bytes nobody asked for: the connection cannot be trusted
            self.close()
            return
        try:
            complete = reply.feed(data, time.perf_counter())
        except CutError as exc:
            self._finish(exc)
            self.close()
            return
        if complete:
            self._finish(None)

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail (or, for a close-delimited body, complete) the request in flight."""
        self.closed = True
        reply = self.reply
        if reply is not None:
            cut = None if reply.lost() else CutError(
                "the server closed the connection before the answer was complete"
                if exc is None else f"connection lost: {type(exc).__name__}: {exc}")
            self._finish(cut)

    def _finish(self, exc: Exception | None) -> None:
        waiter, self.waiter, self.reply = self.waiter, None, None
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)

    def close(self) -> None:
        """Close the connection (the request in flight, if any, is cut)."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def exchange(self, request: bytes, reply: Reply) -> None:
        """Send ``request``; return when ``reply`` is complete.

        Raises:
            CutError: the connection ended or answered garbage first.
        """
        assert self.transport is not None
        assert self.reply is None
        self.reply = reply
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        await self.waiter


class Pool:
    """Keep-alive connections to one endpoint URL, opened as needed and reused LIFO.

    Args:
        url: ``http://HOST:PORT/PATH`` or ``https://…``; every request is a POST to it.
        headers: Extra request headers.
    """

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = (ssl.create_default_context()
                                           if parts.scheme == "https" else None)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        host = self.host if parts.port is None else f"{self.host}:{self.port}"
        self._prefix = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\n"
                        "Content-Type: application/json\r\nAccept-Encoding: identity\r\n"
                        f"{extra}Content-Length: ").encode("latin-1")
        self._idle: list[_Conn] = []
        self._all: set[_Conn] = set()
        self.budget = AnswerBudget(MAX_POOLED_ANSWER_BYTES)

    def request(self, body: bytes) -> bytes:
        """The bytes of a POST of ``body``."""
        return b"".join((self._prefix, str(len(body)).encode(), b"\r\n\r\n", body))

    async def _open(self) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                _, conn = await loop.create_connection(_Conn, self.host, self.port,
                                                       ssl=self.ssl)
        except TimeoutError:
            raise ConnectError(f"cannot connect to {self.host}:{self.port}: no answer within "
                               f"{CONNECT_TIMEOUT_S:g} s") from None
        except OSError as exc:
            raise ConnectError(f"cannot connect to {self.host}:{self.port}: "
                               f"{type(exc).__name__}: {exc}") from None
        self._all.add(conn)
        return conn

    async def post(self, request: bytes, reply: Reply) -> None:
        """Send ``request`` (from :meth:`request`) and wait until ``reply`` is complete. The
        answer's bytes are charged to the pool's :class:`AnswerBudget` until the caller's
        :meth:`Reply.release`.

        Raises:
            ConnectError: no connection could be opened.
            CutError: the connection ended, or answered garbage, before the answer was
                complete; :class:`PoolFullError`: the answers in flight would pass the
                pool's budget.
        """
        conn = None
        while self._idle:
            candidate = self._idle.pop()
            if not candidate.closed:
                conn = candidate
                break
            self._all.discard(candidate)
        reused = conn is not None
        reply.budget = self.budget
        if conn is None:
            conn = await self._open()
        try:
            try:
                await conn.exchange(request, reply)
            except CutError:
                if not (reused and reply.received == 0):
                    raise
                conn.close()  # the server had closed it while it sat idle: once more
                self._all.discard(conn)
                conn = await self._open()
                await conn.exchange(request, reply)
        except BaseException:
            conn.close()  # cut, cancelled or timed out mid-answer: not reusable
            self._all.discard(conn)
            raise
        if reply.keep_alive and not conn.closed:
            self._idle.append(conn)
        else:
            conn.close()
            self._all.discard(conn)

    def close(self) -> None:
        """Close every connection."""
        for conn in self._all:
            conn.close()
        self._all.clear()
        self._idle.clear()
