"""The lean HTTP/1.1 client's answer parser (:class:`executor.endpoint.http1.Reply`): every
framing, fed whole and split at every byte, and what it refuses; and the pool against a
server that closes kept-alive connections.
"""

from __future__ import annotations

import asyncio

import pytest

from executor.endpoint.http1 import CutError, Pool, Reply

BODY = b'data: {"x": 1}\n\ndata: [DONE]\n\n'
CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % 14 + BODY[:14] + b"\r\n"
           + b"%x;ext=1\r\n" % (len(BODY) - 14) + BODY[14:] + b"\r\n0\r\n\r\n")
LENGTH = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY),
                                                                                 BODY)
CLOSE = b"HTTP/1.0 200 OK\r\n\r\n" + BODY


def _feed(raw: bytes, cut: int | None) -> tuple[Reply, bool]:
    reply = Reply()
    parts = [raw] if cut is None else [raw[:cut], raw[cut:]]
    done = False
    for k, part in enumerate(parts):
        if part:
            done = reply.feed(part, float(k))
    return reply, done


@pytest.mark.parametrize("raw", [CHUNKED, LENGTH], ids=["chunked", "length"])
def test_every_split_gives_the_same_body(raw: bytes) -> None:
    for cut in [None, *range(1, len(raw))]:
        reply, done = _feed(raw, cut)
        assert done and reply.complete, cut
        assert reply.body() == BODY, cut
        assert reply.status == (200 if raw is CHUNKED else 503)
        assert reply.keep_alive
    reply, _ = _feed(CHUNKED, None)
    assert {t for t, _ in reply.pieces} == {0.0}  # one read: one arrival time


def test_a_close_delimited_body_ends_with_the_connection() -> None:
    reply, done = _feed(CLOSE, 10)
    assert not done and not reply.keep_alive
    assert reply.lost() and reply.body() == BODY


def test_a_cut_answer_is_not_complete() -> None:
    reply, done = _feed(CHUNKED[:-20], None)
    assert not done and not reply.lost()


@pytest.mark.parametrize("raw", [b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 200 OK\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\nzz\r\n"])
def test_garbage_is_refused(raw: bytes) -> None:
    with pytest.raises(CutError):
        Reply().feed(raw, 0.0)


def test_the_pool_retries_a_kept_alive_connection_the_server_closed() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    async def main() -> list[bytes]:
        served: list[int] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(2)
            served.append(1)
            writer.write(answer)
            await writer.drain()
            writer.close()  # "Connection: close" not said: the client keeps it in its pool

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = Pool(f"http://127.0.0.1:{port}/x")
        bodies = []
        for _ in range(3):
            reply = Reply()
            await pool.post(pool.request(b"{}"), reply)
            bodies.append(reply.body())
        pool.close()
        server.close()
        await server.wait_closed()
        assert len(served) == 3
        return bodies

    assert asyncio.run(main()) == [b"ok"] * 3
