"""Issue #28's adversarial round on the endpoint commands (``bench``, ``calibrate
--endpoint``): malformed URLs, servers that answer garbage, cut or endless bodies, and inputs
whose request bodies or plans alone would take gigabytes. Each is a one-line error (exit 2, no
traceback) or a failed request counted by its cause; none may fill the client's memory.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from executor.endpoint import http1
from executor.endpoint.client import Outcome, StreamError, _line
from executor.endpoint.http1 import CutError, Reply
from tests.executor.endpoint.conftest import bench_cli, one_line_error, write_scenario
from tests.executor.endpoint.test_request_bad_input import _calibrate_cli, write_rl_scenario


def _serve(answer: bytes, *, endless: bytes = b"") -> Iterator[str]:
    """A loopback server answering every request with ``answer`` (then ``endless`` until
    the client hangs up).
    """
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(answer)
                while endless and not stop.is_set():
                    conn.sendall(endless)
            except OSError:
                return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    listener.close()


@pytest.fixture
def garbage_url() -> Iterator[str]:
    yield from _serve(b"\x00\xff garbage, not HTTP\r\n\r\n")


@pytest.fixture
def endless_url() -> Iterator[str]:
    # a 200 that claims 4 GB and keeps sending: urllib's read() used to buffer all of it
    # (7.7 GB before a RecursionError on the model list; 23 GB when chunked)
    yield from _serve(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 4000000000\r\n\r\n[", endless=b"1," * 65536)


@pytest.mark.parametrize(("url", "needle"), [
    ("http://[::1", "Invalid IPv6 URL"),  # was: internal error (ValueError)
    ("http://127.0.0.1:99999", "Port out of range"),  # was: "connection refused"
    ("http://127.0.0.1:0", "a port in 1-65535"),
    ("http://user:pw@127.0.0.1:8000", "user credentials"),  # was: "Name or service not known"
    ("http://127.0.0.1:8000?x=1", "no query or fragment"),  # was: a 404 on ".../?x=1/v1/..."
])
def test_malformed_endpoint_urls(tmp_path: Path, url: str, needle: str) -> None:
    one_line_error(bench_cli(str(write_scenario(tmp_path / "s.yaml")), "--endpoint", url,
                             "--model", "m"), "--endpoint", needle)


def test_a_server_that_answers_garbage(tmp_path: Path, garbage_url: str) -> None:
    # http.client's BadStatusLine was not caught: an internal error (exit 3) whose message
    # carried the raw bytes (a NUL) to the terminal
    one_line_error(bench_cli(str(write_scenario(tmp_path / "s.yaml")), "--endpoint",
                             garbage_url), "not a complete HTTP answer", "BadStatusLine")
    one_line_error(bench_cli(str(write_rl_scenario(tmp_path / "r.yaml")), "--endpoint",
                             garbage_url, "--api", "http-json"), "not a complete HTTP answer")


def test_an_endless_answer_is_refused_not_buffered(tmp_path: Path, endless_url: str) -> None:
    for args in (["--endpoint", endless_url],  # GET /v1/models
                 ["--endpoint", endless_url, "--api", "kserve-v2", "--model", "m"]):
        scn = write_scenario(tmp_path / "s.yaml") if len(args) == 2 else \
            write_rl_scenario(tmp_path / "r.yaml")
        one_line_error(bench_cli(str(scn), *args, timeout_s=60), "longer than 16 MiB")


def test_the_streaming_client_caps_an_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    # a run's request whose answer never ends failed only when memory ran out (7.5 GB)
    reply = Reply()
    with pytest.raises(CutError, match="Content-Length 4000000000 is over 64 MiB"):
        reply.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 4000000000\r\n\r\n", 0.0)
    monkeypatch.setattr(http1, "MAX_ANSWER_BYTES", 1000)
    reply = Reply()
    reply.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 0.0)
    for _ in range(8):  # 47 + 8 x 106 bytes: under the cap
        reply.feed(b"64\r\n" + b"x" * 100 + b"\r\n", 0.0)
    with pytest.raises(CutError, match="longer than 0 MiB"):  # the read that crosses it
        reply.feed(b"64\r\n" + b"x" * 100 + b"\r\n", 0.0)


def test_json_nested_deeper_than_the_stack_is_malformed() -> None:
    # json.loads raised RecursionError, which nothing caught
    with pytest.raises(StreamError) as err:
        _line(b"data: " + b"[" * 100_000, 0.0, Outcome(0, 0.0), False, [0])
    assert err.value.cause == "malformed_sse"


@pytest.mark.parametrize(("sets", "needles"), [
    # a shape of [1e9] allocated 7.45 GiB for the preflight's one body before anything
    (["payload.inputs=[{name: x, datatype: FP32, shape: [1000000000]}]"],
     ("payload.inputs (shape [1000000000])", "GiB", "at most 512 MiB")),
    # np.prod overflowed to a negative count: an internal error
    (["payload.inputs=[{name: x, datatype: INT64, shape: [1000000000000000000, 1000000000]}]"],
     ("payload.inputs",)),
    # 10 M sentences per body: 2.8 GB before the server's 413
    (["payload.inputs=[{name: x, datatype: BYTES, shape: [10000000]}]"], ("payload.inputs",)),
    (["workload.size=1000000000"], ("workload.size",)),
    # the arrival schedule alone: 7.45 GiB, then an internal MemoryError
    (["workload.n_requests=1000000000", "workload.rate_rps=1e9"],
     ("workload.n_requests: this bench would hold",)),
])
def test_request_bodies_beyond_memory_are_refused(stub_url: str, tmp_path: Path,
                                                  sets: list[str],
                                                  needles: tuple[str, ...]) -> None:
    args = [a for s in sets for a in ("--set", s)]
    proc = bench_cli(str(write_rl_scenario(tmp_path / "s.yaml")), "--endpoint", stub_url,
                     "--api", "kserve-v2", *args)
    one_line_error(proc, *needles)


def test_an_image_sized_payload_still_runs(stub_url: str, tmp_path: Path) -> None:
    proc = bench_cli(str(write_rl_scenario(tmp_path / "s.yaml")), "--endpoint", stub_url,
                     "--api", "kserve-v2", "--set",
                     "payload.inputs=[{name: x, datatype: FP32, shape: [-1, 3, 8, 8]}]",
                     "--set", "workload.n_requests=20", "-q")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("flags", "needle"), [
    (["--set", "workload.output_tokens=1000000000", "--set",
      "policy.num_gpu_blocks=100000000"],  # 8e9 token slots: 59.6 GiB, MemoryError
     "workload.output_tokens: this bench would hold"),
    (["--drain-timeout-s", "nan"], "--drain-timeout-s nan: must be > 0"),
    (["--request-timeout-s", "0"], "--request-timeout-s 0: must be > 0"),
    (["--request-timeout-s", "nan"], "--request-timeout-s nan: must be > 0"),
    (["--token-ids", "0:100000000000000000000"], "--token-ids 0:100000000000000000000"),
    (["--model", ""], "--model ''"),
])
def test_llm_bench_flags(stub_url: str, tmp_path: Path, flags: list[str], needle: str) -> None:
    args = ["--model", "instant", *flags] if "--model" not in flags else flags
    one_line_error(bench_cli(str(write_scenario(tmp_path / "s.yaml")), "--endpoint",
                             stub_url, *args), needle)


def test_calibrate_endpoint_nan_window_and_huge_reps(stub_url: str, tmp_path: Path) -> None:
    base = ["--endpoint", stub_url, "--api", "kserve-v2", "--endpoint-model", "instant",
            "--out", str(tmp_path / "p.json")]
    # nan passed `window_ms < 0` and turned every sample into nan
    one_line_error(_calibrate_cli(*base, "--window-ms", "nan"), "--window-ms nan")
    one_line_error(_calibrate_cli(*base, "--reps", "1000000000"), "--reps 1000000000",
                   "GiB")


def test_model_entries_without_an_id_are_not_a_model(tmp_path: Path) -> None:
    # {"data": [{"noid": 1}]} made the run send model None; {"data": 5} a TypeError
    for listing in (b'{"data": [{"noid": 1}]}', b'{"data": 5}'):
        gen = _serve(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(listing) + listing)
        url = next(gen)
        one_line_error(bench_cli(str(write_scenario(tmp_path / "s.yaml")), "--endpoint",
                                 url), "lists no model")
        gen.close()


@pytest.mark.parametrize("chunk", [b'{"usage": [1]}', b'{"choices": 5}',
                                   b'{"choices": {"text": "a"}}',
                                   b'{"choices": [{"delta": "x"}]}'])
def test_a_chunk_of_the_wrong_shape_is_malformed(chunk: bytes) -> None:
    # catches: a usage that is not an object, choices that are not a list or a chat delta
    # that is not an object raised AttributeError/TypeError out of the parse, which ended
    # the sender's task (and the bench) with a traceback instead of failing one request
    with pytest.raises(StreamError) as err:
        _line(b"data: " + chunk, 0.0, Outcome(0, 0.0), True, [0])
    assert err.value.cause == "malformed_sse"


def test_a_malformed_stream_returns_its_bytes_to_the_pool() -> None:
    # catches: an answer whose parse raised anything but StreamError kept its bytes charged
    # to the pool's answer budget (send released them only after a clean parse), so a few
    # such answers starved the rest of the run into answers_over_budget
    import asyncio

    from executor.endpoint.client import Job, send
    from executor.endpoint.http1 import Pool

    pool = Pool("http://127.0.0.1:9/x")
    body = b'data: {"usage": [1]}\n\ndata: [DONE]\n\n'

    async def post(request: bytes, reply: Reply) -> None:  # the answer, charged as it comes
        reply.budget = pool.budget
        reply.feed(b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(body)).encode()
                   + b"\r\n\r\n" + body, 0.0)

    pool.post = post  # type: ignore[method-assign]
    out = Outcome(0, 0.0)
    asyncio.run(send(pool, b"", Job(0, 0.0, [1], 1, 1), out, 0.0, False, None))
    assert (out.status, out.cause) == ("failed", "malformed_sse")
    assert pool.budget.held == 0 and pool.budget.peak > 0
