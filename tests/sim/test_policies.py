"""Policies tested like vLLM's scheduler: fabricated queues and times, whole decision logs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.serving.policies import (
    AimdBatching,
    DynamicBatching,
    FixedBatch,
    Greedy,
    NoBatching,
    SloBatching,
)
from sim.serving.queues import make_queue
from sim.serving.records import RequestTable
from sim.serving.types import RUNNING, Decision, ReplicaView

FREE = ReplicaView(0)


class FakeQueue:
    """A queue of fabricated requests; ``take`` removes what a policy dispatched or dropped."""

    def __init__(self, arrivals_s: list[float], discipline: str = "fifo",
                 deadlines_s: list[float] | None = None, priorities: list[int] | None = None,
                 sizes: list[int] | None = None) -> None:
        n = len(arrivals_s)
        self.table = RequestTable(
            np.array(arrivals_s, float), np.array(sizes or [1] * n, np.int64),
            np.array(priorities or [0] * n, np.int8),
            np.array(deadlines_s if deadlines_s is not None else [math.inf] * n, float))
        self.queue = make_queue(discipline, self.table, 0)
        self._next = 0

    def arrive_until(self, now_s: float) -> None:
        while self._next < self.table.n and self.table.arrival_s[self._next] <= now_s:
            self.queue.push(self._next)
            self._next += 1

    def take(self, decision: Decision) -> None:
        for rid in [*decision.dispatch, *(r for r, _ in decision.drop)]:
            self.table.status[rid] = RUNNING
            self.queue.forget(rid)


def replay(policy, fq: FakeQueue, times_s: list[float]) -> list[tuple[float, Decision]]:
    log = []
    for now in times_s:
        fq.arrive_until(now)
        d = policy.decide(now, fq.queue.view, FREE)
        fq.take(d)
        log.append((now, d))
    return log


def test_no_batching_takes_the_head_only() -> None:
    fq = FakeQueue([0.0, 0.0, 0.1])
    log = replay(NoBatching(), fq, [0.0, 0.01, 0.2, 0.3])
    assert [d.dispatch for _, d in log] == [(0,), (1,), (2,), ()]


def test_greedy_takes_up_to_max_in_fifo_order() -> None:
    fq = FakeQueue([0.0] * 5 + [1.0])
    log = replay(Greedy(max_batch_size=3), fq, [0.0, 0.5, 1.0])
    assert [d.dispatch for _, d in log] == [(0, 1, 2), (3, 4), (5,)]
    assert all(d.wake_at_s is None for _, d in log)


def test_fixed_waits_for_a_full_batch_then_flushes_on_timeout() -> None:
    fq = FakeQueue([0.0, 0.001, 0.002, 0.010, 0.011])
    policy = FixedBatch(batch_size=3, timeout_ms=5)
    log = replay(policy, fq, [0.0, 0.001, 0.002, 0.010, 0.011, 0.015])
    assert log == [
        (0.0, Decision(wake_at_s=0.005)),
        (0.001, Decision(wake_at_s=0.005)),
        (0.002, Decision(dispatch=(0, 1, 2))),
        (0.010, Decision(wake_at_s=pytest.approx(0.015))),
        (0.011, Decision(wake_at_s=pytest.approx(0.015))),
        (0.015, Decision(dispatch=(3, 4))),
    ]


def test_fixed_without_timeout_never_flushes() -> None:
    fq = FakeQueue([0.0, 0.1])
    log = replay(FixedBatch(batch_size=3), fq, [0.0, 0.1, 100.0])
    assert all(d == Decision() for _, d in log)


def test_dynamic_request_timer_counts_from_the_oldest_enqueue() -> None:
    # Triton: the oldest request has already waited while the replica was busy.
    fq = FakeQueue([0.000, 0.001, 0.004])
    policy = DynamicBatching(max_batch_size=4, max_wait_ms=2, timer="request")
    log = replay(policy, fq, [0.0015, 0.004, 0.005, 0.006])
    assert log == [
        (0.0015, Decision(wake_at_s=0.002)),
        (0.004, Decision(dispatch=(0, 1, 2))),  # oldest (t=0) is past its 2 ms
        (0.005, Decision()),
        (0.006, Decision()),
    ]


def test_dynamic_first_timer_starts_when_the_batcher_takes_the_first_request() -> None:
    # Ray Serve / TorchServe: the same queue waits a full max_wait from the first look.
    fq = FakeQueue([0.000, 0.001, 0.004])
    policy = DynamicBatching(max_batch_size=4, max_wait_ms=2, timer="first")
    log = replay(policy, fq, [0.0015, 0.0035, 0.004, 0.0041, 0.0061])
    assert log == [
        (0.0015, Decision(wake_at_s=pytest.approx(0.0035))),
        (0.0035, Decision(dispatch=(0, 1))),
        (0.004, Decision(wake_at_s=pytest.approx(0.006))),
        (0.0041, Decision(wake_at_s=pytest.approx(0.006))),
        (0.0061, Decision(dispatch=(2,))),
    ]


def test_dynamic_arrival_timer_closes_batches_while_the_replica_is_busy() -> None:
    # Ray Serve's @serve.batch (batching.py): the next batch closes max_wait after its first
    # request arrived (or after the previous batch closed), even while the replica is busy;
    # a replica freed later takes only what arrived inside that window.
    fq = FakeQueue([0.000, 0.001, 0.004, 0.005, 0.0055, 0.020])
    policy = DynamicBatching(max_batch_size=4, max_wait_ms=2, timer="arrival")
    log = replay(policy, fq, [0.0005, 0.0100, 0.0101, 0.0102, 0.0201, 0.0300])
    assert log == [
        (0.0005, Decision(wake_at_s=pytest.approx(0.002))),
        # busy until 0.010: the window [0, 0.002] closed long ago, with requests 0 and 1 only
        (0.0100, Decision(dispatch=(0, 1))),
        # the next clock started at request 2's arrival (after the close): 2, 3 and 4 inside
        (0.0101, Decision(dispatch=(2, 3, 4))),
        (0.0102, Decision()),
        (0.0201, Decision(wake_at_s=pytest.approx(0.022))),
        (0.0300, Decision(dispatch=(5,))),
    ]
    # the 'first' timer, on the same queue, takes all that waits when the replica is freed
    # (a full batch at once here: larger batches under load)
    first = replay(DynamicBatching(max_batch_size=4, max_wait_ms=2, timer="first"),
                   FakeQueue([0.000, 0.001, 0.004, 0.005, 0.0055, 0.020]), [0.0100])
    assert first[0][1].dispatch == (0, 1, 2, 3)
    with pytest.raises(ValueError, match="preferred_batch_sizes"):
        DynamicBatching(max_batch_size=4, timer="arrival", preferred_batch_sizes=[2])


def test_dynamic_arrival_timer_full_batch_closes_at_its_last_arrival() -> None:
    fq = FakeQueue([0.0, 0.001, 0.001, 0.0015, 0.0016, 0.01])
    policy = DynamicBatching(max_batch_size=4, max_wait_ms=5, timer="arrival")
    log = replay(policy, fq, [0.0015, 0.0016, 0.0017])
    # full at 0.0015 (closed then); the next clock starts at 0.0016's arrival
    assert log[0][1].dispatch == (0, 1, 2, 3)
    assert log[1][1] == Decision(wake_at_s=pytest.approx(0.0066))
    assert log[2][1] == Decision(wake_at_s=pytest.approx(0.0066))


def test_dynamic_arrival_timer_a_backlog_past_max_as_rays_batcher_takes_it() -> None:
    # Ray 2.60 batching.py: wait_for_batch takes the first queued request, starts the clock,
    # moves up to max_batch_size queued requests in at once and closes a full batch at once
    # (l. 267-355); _process_batches then forms the next batch at once, while the replica
    # still runs (l. 474-495). Five requests at 0, max 2, window 5 ms, one more at 3 ms and
    # one at 9 ms, the replica busy until 20 ms. By hand: [0, 1] closes at 0 (full); [2, 3]
    # starts its clock at that close (0) and is full at once; [4] starts its clock at 0 too
    # (the previous close, not its own later look) and is full when request 5 comes (3 ms);
    # request 6 (9 ms) opens a new batch, its clock at its arrival: closes at 14 ms.
    fq = FakeQueue([0.0, 0.0, 0.0, 0.0, 0.0, 0.003, 0.009])
    policy = DynamicBatching(max_batch_size=2, max_wait_ms=5, timer="arrival")
    log = replay(policy, fq, [0.020, 0.021, 0.022, 0.023])
    assert [d.dispatch for _, d in log] == [(0, 1), (2, 3), (4, 5), (6,)]
    # asked before the last clock runs out (the replica freed early), it waits for it
    fq = FakeQueue([0.0, 0.0, 0.0, 0.0, 0.0, 0.003, 0.009])
    policy = DynamicBatching(max_batch_size=2, max_wait_ms=5, timer="arrival")
    log = replay(policy, fq, [0.0, 0.0, 0.002, 0.004, 0.010, 0.014])
    assert [(d.dispatch, d.wake_at_s) for _, d in log] == [
        ((0, 1), None), ((2, 3), None),
        ((), pytest.approx(0.005)),  # [4] alone at 2 ms: its clock (from 0) ends at 5 ms
        ((4, 5), None),  # full at 3 ms
        ((), pytest.approx(0.014)), ((6,), None)]


def test_dynamic_dispatches_a_full_batch_at_once() -> None:
    fq = FakeQueue([0.0] * 10)
    log = replay(DynamicBatching(max_batch_size=4, max_wait_ms=50), fq, [0.0, 0.0, 0.0])
    assert [d.dispatch for _, d in log] == [(0, 1, 2, 3), (4, 5, 6, 7), ()]
    assert log[2][1].wake_at_s == pytest.approx(0.05)


def test_dynamic_preferred_sizes() -> None:
    policy = DynamicBatching(max_batch_size=8, max_wait_ms=1, preferred_batch_sizes=[2, 4])
    fq = FakeQueue([0.0] * 3 + [0.01] * 5)
    log = replay(policy, fq, [0.0, 0.001, 0.001, 0.01, 0.01])
    # Triton: as soon as any preferred size can be formed, the largest one that can goes at
    # once (3 waiting -> 2 at t=0); the leftover goes alone when its wait is used up; 5
    # waiting -> a preferred 4 at once
    assert [d.dispatch for _, d in log] == [(0, 1), (2,), (), (3, 4, 5, 6), ()]
    assert log[4][1].wake_at_s == pytest.approx(0.011)


def test_dynamic_preferred_sizes_as_in_tritons_docs() -> None:
    # preferred [4, 8] with 7 waiting: a batch of 4 can be formed, so 4 go at once
    policy = DynamicBatching(max_batch_size=8, max_wait_ms=100, preferred_batch_sizes=[4, 8])
    fq = FakeQueue([0.0] * 7)
    fq.arrive_until(0.0)
    assert policy.decide(0.0, fq.queue.view, FREE).dispatch == (0, 1, 2, 3)


def test_aimd_grows_on_full_fast_batches_and_backs_off_on_slow_ones() -> None:
    policy = AimdBatching(slo_ms=10, max_batch_size=6, initial_batch_size=2, additive_step=2)
    caps = [policy.cap]
    for size, service_ms in [(2, 5), (4, 8), (1, 3), (6, 12), (5, 4)]:
        policy.on_batch_done(0.0, size, service_ms / 1e3)
        caps.append(policy.cap)
    # full & fast: +2, full & fast: +2 (capped at 6), not full: same, slow: floor(6*0.9)=5,
    # full (5>=5) & fast: +2 capped at 6
    assert caps == [2, 4, 6, 6, 5, 6]
    fq = FakeQueue([0.0] * 10)
    fq.arrive_until(0.0)
    assert policy.decide(0.0, fq.queue.view, FREE).dispatch == tuple(range(6))


def test_slo_dispatches_the_largest_batch_meeting_the_earliest_deadline_and_drops_hopeless(
        ) -> None:
    def estimate(items: int) -> float:
        return 0.004 + 0.001 * items  # 5 ms for 1, 8 ms for 4

    arrivals = [0.0, 0.001, 0.002, 0.003, 0.004]
    deadlines = [0.004, 0.0125, 0.013, 0.02, 0.02]
    fq = FakeQueue(arrivals, deadlines_s=deadlines)
    fq.arrive_until(0.005)
    d = SloBatching(estimate, max_batch_size=8).decide(0.005, fq.queue.view, FREE)
    # request 0 cannot make 4 ms even alone; batch [1,2,3] ends at 0.005 + 0.007 = 0.012
    # (meets 12.5 ms), adding 4 ends at 0.013 > 0.0125
    assert d.drop == ((0, "deadline_unmeetable"),)
    assert d.dispatch == (1, 2, 3)


def test_priority_and_edf_disciplines_order_the_view() -> None:
    fq = FakeQueue([0.0, 0.001, 0.002, 0.003], discipline="priority", priorities=[1, 0, 1, 0])
    fq.arrive_until(1.0)
    assert fq.queue.view.ids() == [1, 3, 0, 2]
    assert Greedy(3).decide(1.0, fq.queue.view, FREE).dispatch == (1, 3, 0)
    fe = FakeQueue([0.0, 0.001, 0.002], discipline="edf", deadlines_s=[0.5, 0.1, 0.3])
    fe.arrive_until(1.0)
    assert fe.queue.view.ids() == [1, 2, 0]
    assert fe.queue.view.ids(2) == [1, 2]


def test_policies_never_mutate_the_queue() -> None:
    fq = FakeQueue([0.0, 0.0, 0.0])
    fq.arrive_until(0.0)
    before = (fq.queue.length, fq.queue.view.ids())
    for policy in (NoBatching(), Greedy(2), FixedBatch(2, 1), DynamicBatching(2, 1),
                   AimdBatching(), SloBatching(lambda i: 0.001, 2)):
        policy.decide(0.0, fq.queue.view, FREE)
        assert (fq.queue.length, fq.queue.view.ids()) == before


@pytest.mark.parametrize(("cls", "kwargs", "field"), [
    (Greedy, {"max_batch_size": 0}, "max_batch_size"),
    (DynamicBatching, {"timer": "sometimes"}, "timer"),
    (DynamicBatching, {"max_wait_ms": -1}, "max_wait_ms"),
    (DynamicBatching, {"max_batch_size": 4, "preferred_batch_sizes": [8]}, "preferred"),
    (FixedBatch, {"timeout_ms": -2}, "timeout_ms"),
    (AimdBatching, {"backoff": 1.5}, "backoff"),
])
def test_bad_policy_knobs_name_the_field(cls, kwargs, field) -> None:
    with pytest.raises(ValueError, match=field):
        cls(**kwargs)


def test_policy_modules_import_neither_simpy_nor_torch() -> None:
    import ast
    from pathlib import Path

    import sim.serving.policies as pkg

    for path in Path(pkg.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {alias.name.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.Import | ast.ImportFrom)
                 for alias in (node.names if isinstance(node, ast.Import) else
                               [type("A", (), {"name": node.module or ""})()])}
        assert not names & {"simpy", "torch", "time"}, path
