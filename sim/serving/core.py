"""The serving state machine shared by both drivers, with its one event loop.

:class:`ServingCore` owns the queues, admission, routing, the policy calls, the wake-ups and
the records. It has no clock. A driver calls :meth:`ServingCore.step` with the time and the
batches that finished since its last call; the core applies, in this order,

1. for each finished batch (by finish time): the arrivals and expiries up to its finish, then
   the finish itself (so a router never sees a replica freed before it really was);
2. the arrivals and expiries up to now;
3. the policy of each free replica that has reason to look: the replicas just freed (in
   finish order), those whose wake-up fell due, then those whose queue received requests,

and answers with the batches to start now and the time at which to call it again if nothing
finishes first. The SimPy engine and the live executor are only clocks around this loop:
one samples a service time and schedules the finish, the other hands the batch to a worker
thread. Neither decides anything.

Units: :mod:`sim.serving.sources` (arrivals), :mod:`sim.serving.admission` (queues, bounds,
timeouts, routing), :mod:`sim.serving.dispatch` (policy calls, batches),
:mod:`sim.serving.invariants` (conservation).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

from sim.serving.admission import Admission
from sim.serving.dispatch import Batch, Dispatcher, PolicyError
from sim.serving.fleet import DRAINING, READY, STARTING, Fleet
from sim.serving.invariants import InvariantError, check_invariants
from sim.serving.queues import RequestQueue, make_queue
from sim.serving.records import BatchTable, QueueSeries, RequestTable
from sim.serving.router_tasks import RetryConfig
from sim.serving.routing import ReplicaLoad, Router
from sim.serving.sources import ClientSource, ScheduleSource, Source
from sim.serving.types import Policy

_NONE: frozenset[int] = frozenset()
_new_actions = tuple.__new__  # CoreActions without the NamedTuple's Python-level __new__


def _FINISH_S(done: tuple[object, ...]) -> float:  # noqa: N802 - a sort key
    return done[1]  # type: ignore[return-value]


__all__ = ["Batch", "ClientSource", "CoreActions", "Finished", "InvariantError",
           "PolicyError", "ScheduleSource", "ServingCore"]


class Finished(NamedTuple):
    """A batch that ended: when, how long its service took, and why it failed (or None)."""

    batch: Batch
    finish_s: float
    service_s: float
    error: str | None = None


class CoreActions(NamedTuple):
    """What a driver does after :meth:`ServingCore.step`.

    Attributes:
        start: Batches to start now, in dispatch order.
        wake_s: Call :meth:`ServingCore.step` again at this time if no batch finishes first
            (the next arrival while a replica is free, a policy's wake-up, or the
            autoscaler's next control period; inf: never).
        launch: Replicas to start (autoscaling): load the model, then report them ready.
        stop: Replicas that have finished their work after being removed: free the model.
        cancel: Launches to drop (a scale-down while they start): never report them ready,
            free what they loaded. A driver applies ``cancel``, then ``stop`` and ``kill``,
            then ``launch``: a slot in two of them was ended before it was launched again.
        kill: Draining replicas killed at their kill timeout (``graceful_shutdown_timeout_s``)
            while batches ran on them: the core has failed those batches' requests and
            ignores their finishes (:meth:`ServingCore.drop_abandoned`); free the replica
            without waiting for the calls. A killed replica that ran nothing is in ``stop``.
    """

    start: list[Batch]
    wake_s: float
    launch: tuple[int, ...] = ()
    stop: tuple[int, ...] = ()
    cancel: tuple[int, ...] = ()
    kill: tuple[int, ...] = ()


class ServingCore:
    """Queues, admission, routing, policy calls, wake-ups and records, without a clock.

    Args:
        table: Request records (preloaded schedule for open loop).
        source: Where arrivals come from.
        policies: One policy object per replica.
        router: Per-replica queues fed by this router; ``None`` = one shared queue.
        discipline: Queue discipline (fifo, priority, edf).
        max_len: Reject an arrival when its queue already holds this many (None: unbounded).
        timeout_s: Expire a request still waiting this long after arrival (None: never).
        estimate_s: Latency model, seconds for a batch of ``items`` items (for routing by
            work and for batch expectations).
        fleet: Autoscaled replicas (one policy per slot); None: every replica always ready.
        max_ongoing: At most this many requests at a replica, queued + running (Ray Serve's
            ``max_ongoing_requests``); the rest wait at the router
            (:mod:`sim.serving.admission`). None: no bound.
        retry: With ``max_ongoing``, the router retries held requests as Ray Serve's
            routing tasks do (:mod:`sim.serving.router_tasks`); None: at once.
    """

    def __init__(self, table: RequestTable, source: Source, policies: Sequence[Policy], *,
                 router: Router | None = None, discipline: str = "fifo",
                 max_len: int | None = None, timeout_s: float | None = None,
                 estimate_s: Callable[[int], float] = lambda items: 0.0,
                 fleet: Fleet | None = None, max_ongoing: int | None = None,
                 retry: RetryConfig | None = None) -> None:
        self.table = table
        self.source = source
        n = len(policies)
        self.n_replicas = n
        n_queues = 1 if router is None else n
        self.queues: list[RequestQueue] = [make_queue(discipline, table, q)
                                           for q in range(n_queues)]
        for queue in self.queues:
            queue.routed = router is not None
        self.queue_of = [0 if router is None else r for r in range(n)]
        self.replicas_of = [[r for r in range(n) if self.queue_of[r] == q]
                            for q in range(n_queues)]
        self.queue_series = QueueSeries()
        self.dispatcher = Dispatcher(table, source, policies, self.queues, self.queue_of,
                                     self.queue_series, estimate_s,
                                     needs_work=bool(getattr(router, "needs_work_estimate",
                                                             False)))
        self.fleet = fleet
        self.admission = Admission(table, source, self.queues, router, self.queue_series,
                                   self.dispatcher.loads, max_len=max_len, timeout_s=timeout_s,
                                   candidates=self.route_candidates if fleet else None,
                                   max_ongoing=max_ongoing,
                                   running_of=self.dispatcher.running_requests_of,
                                   retry=retry,
                                   ready=(lambda: fleet.slots(READY)) if fleet else None)
        self.wake_at_s = [math.inf] * n  # a policy's requested wake-up (only while free)
        self._min_wake_s = math.inf  # the earliest of them
        for q in range(n_queues):
            self.queue_series.record(0.0, q, 0)
        self._launch: list[int] = []
        self._answered: deque[tuple[float, int]] = deque()  # (batch end, requests): outside_s
        self._stop: list[int] = []
        self._cancel: list[int] = []
        self._kill: list[int] = []
        self.abandoned: set[int] = set()  # batches of killed replicas whose end is ignored
        self._moved: set[int] = set()  # queues fed by a removed replica's queue this step
        if fleet is not None:
            if len(fleet.state) != n:
                raise ValueError(f"fleet has {len(fleet.state)} slots for {n} policies")
            for r, state in enumerate(fleet.state):
                if state != READY:
                    self.dispatcher.set_active(r, False, 0.0)

    # -- the event loop ----------------------------------------------------------------------
    def step(self, now_s: float, finished: Sequence[Finished] = (), *,
             dispatch: bool = True, ready: Sequence[tuple[int, float]] = ()) -> CoreActions:
        """Advance the core to ``now_s``; see the module docstring for the order.

        Args:
            now_s: The driver's time.
            finished: Batches that ended since the last call (``finish_s`` <= ``now_s``).
            dispatch: False: record finishes and arrivals but consult no policy (a run that
                is being abandoned or closed).
            ready: Launched replicas whose cold start ended since the last call, with the
                time it ended (autoscaling).

        Returns:
            The batches to start now, when to call again, and replicas to launch or stop.
        """
        admit, dispatcher, fleet = self.admission.admit, self.dispatcher, self.fleet
        freed: list[int] = []
        early: set[int] | frozenset[int] = _NONE  # queues fed before an earlier event
        admitted_s = -math.inf  # arrivals are applied up to here
        if finished:
            for done in finished if len(finished) == 1 else sorted(finished,
                                                                  key=_FINISH_S):
                batch, finish_s = done[0], done[1]
                if self.abandoned and self.drop_abandoned(batch.id):
                    continue  # its replica was killed: its requests failed then
                if fleet is not None and fleet.kill_after_s is not None and \
                        fleet.next_poll_s() <= finish_s:  # a kill may come before this end
                    self._stop_polls(finish_s)
                    if self.drop_abandoned(batch.id):
                        continue
                got = admit(finish_s)
                admitted_s = finish_s
                if got:
                    early = early | got
                dispatcher.finish(batch, finish_s, done[2], done[3])
                freed.append(batch.replica)
                if fleet is not None and fleet.outside_s:
                    self._answered.append((finish_s, len(batch.request_ids)))
                if self.admission.n_held:  # the replica has room: the router's wait moves
                    early = early | self.admission.release(finish_s)
                if fleet is not None:
                    self._stop_if_drained(batch.replica, finish_s)
        if fleet is not None:
            admitted_s = -math.inf
            for replica, ready_s in sorted(ready, key=lambda x: x[1]):
                early = early | admit(ready_s)
                fleet.ready(replica, ready_s)
                dispatcher.set_active(replica, True, ready_s)
                freed.append(replica)
                if self.admission.n_held:
                    early = early | self.admission.release(ready_s)
            if fleet.next_poll_s() <= now_s:  # draining replicas' stop polls (and kills)
                self._stop_polls(now_s)
            if dispatch:
                while fleet.next_tick_s <= now_s and self._ticking():
                    tick_s = fleet.next_tick_s
                    early = early | admit(tick_s)
                    self._control(tick_s, now_s)
                    fleet.next_tick_s = tick_s + fleet.control_period_s
        touched = admit(now_s) if now_s != admitted_s else _NONE
        if early:
            touched = early | touched
        if fleet is not None and dispatch and fleet.empty() and self.queued() > 0:
            self._control(now_s, now_s)  # an arrival to an empty fleet (the activator's poke)
        if self._moved:  # a removed replica's queue went to others: they may start it now
            touched = touched | self._moved
            self._moved = set()
        started: list[Batch] = []
        if dispatch:
            dropped = dispatcher.n_dropped
            if len(freed) == 1 and not touched and self._min_wake_s > now_s:
                self._consult(freed[0], now_s, started)  # the common case: one finish, nothing new
            else:
                consulted: set[int] = set()
                for replica in freed:
                    if replica not in consulted:
                        consulted.add(replica)
                        self._consult(replica, now_s, started)
                if self._min_wake_s <= now_s:
                    for replica, due_s in enumerate(self.wake_at_s):
                        if due_s <= now_s and replica not in consulted:
                            consulted.add(replica)
                            self._consult(replica, now_s, started)
                self._consult_fed(touched, now_s, started, consulted)
            # a policy that dropped requests made room at its replica: the router's wait
            # moves now (else it waits for a batch to end, or forever where none runs)
            while dispatcher.n_dropped != dropped and self.admission.n_held:
                dropped = dispatcher.n_dropped
                self._consult_fed(self.admission.release(now_s), now_s, started)
        if self.table.sink is not None:  # a summary-only run: fold what is full
            self.table.sink.maybe_flush()
        wake_s = self.next_wake_s()
        if fleet is None:
            return _new_actions(CoreActions, (started, wake_s, (), (), (), ()))
        launch, stop, cancel = tuple(self._launch), tuple(self._stop), tuple(self._cancel)
        kill = tuple(self._kill)
        self._launch.clear()
        self._stop.clear()
        self._cancel.clear()
        self._kill.clear()
        return CoreActions(started, wake_s, launch, stop, cancel, kill)

    # -- autoscaling -------------------------------------------------------------------------
    def _ticking(self) -> bool:
        """Whether the autoscaler still has anything to react to: arrivals to come, work
        queued or running, or replicas starting or draining.
        """
        fleet = self.fleet
        assert fleet is not None
        return (self.source.peek_s() < math.inf or self.queued() > 0 or any(self.running)
                or fleet.count(STARTING) > 0 or fleet.count(DRAINING) > 0)

    def _control(self, now_s: float, seen_s: float) -> None:
        """Consult the autoscaler for ``now_s`` (asked at the driver's ``seen_s``); launch,
        cancel and retire replicas as it says (:meth:`sim.serving.fleet.Fleet.plan`).
        """
        fleet = self.fleet
        assert fleet is not None
        running = self.dispatcher.running_requests()
        per_slot = [self.queues[self.queue_of[r]].length if len(self.queues) > 1 else 0
                    for r in range(self.n_replicas)]
        launch, cancel, retire = fleet.plan(
            fleet.view(now_s, self.queued() + self._outside(now_s), running), per_slot, seen_s)
        for r in launch:
            fleet.launch(r, now_s)
            self._launch.append(r)
        for r in cancel:
            self._cancel_launch(r, now_s)
        for r in retire:
            self._retire(r, now_s)

    def _outside(self, now_s: float) -> int:
        """Requests whose batch ended in the last ``fleet.outside_s`` before ``now_s``: still
        on the path outside the replica, which Ray Serve's ongoing count holds.
        """
        answered = self._answered
        if not answered:
            return 0
        lo_s = now_s - self.fleet.outside_s  # type: ignore[union-attr]
        while answered and answered[0][0] <= lo_s:
            answered.popleft()
        return sum(n for end_s, n in answered if end_s <= now_s)

    def _cancel_launch(self, replica: int, now_s: float) -> None:
        """A starting replica is dropped: it goes off now and the requests routed to it
        while no replica was ready go back to the router (as Ray's router, which held them,
        would send them to whichever replica runs first).
        """
        fleet = self.fleet
        assert fleet is not None
        fleet.cancel_for(replica, now_s, self._launch, self._cancel)
        self._reroute(replica, now_s)

    def _retire(self, replica: int, now_s: float) -> None:
        """A replica stops taking work; its own queue goes back to the others."""
        fleet = self.fleet
        assert fleet is not None
        fleet.retire(replica, now_s)
        self.dispatcher.set_active(replica, False, now_s)
        self._set_wake(replica, math.inf)
        self._reroute(replica, now_s)
        self._stop_if_drained(replica, now_s)

    def _reroute(self, replica: int, now_s: float) -> None:
        """Hand a removed replica's own queue back to the router."""
        if len(self.queues) > 1 and self.queues[replica].length:
            old = self.queues[replica]
            moved = old.take_all()
            self.queue_series.record(now_s, replica, 0)
            for rid in moved:
                q = self.admission.requeue(now_s, rid, self._moved)
                if q is not None:  # else every replica is full: it waits at the router
                    self.admission.place(rid, q, now_s, self._moved)

    def _stop_polls(self, now_s: float) -> None:
        """Run the draining replicas' stop polls due by ``now_s``, then their kills."""
        fleet = self.fleet
        assert fleet is not None
        self._stop += fleet.poll(now_s, self.dispatcher.running)
        for replica, kill_s in fleet.kills_due(now_s):
            self._kill_replica(replica, kill_s)

    def _kill_replica(self, replica: int, kill_s: float) -> None:
        """A draining replica reached its kill timeout: it goes off at ``kill_s`` and the
        batches it runs are abandoned, their requests failed then with reason ``shutdown``
        (Ray Serve's controller kills the actor; the requests it held end with the actor's
        death error at their callers; they are not retried). Its queue went back to the
        router at its removal, so it holds nothing else.
        """
        fleet, dispatcher = self.fleet, self.dispatcher
        assert fleet is not None
        running = list(dispatcher.running_batches[replica].values())
        for batch in running:
            dispatcher.finish(batch, kill_s, kill_s - batch.start_s, "shutdown",
                              abandoned=True)
            self.abandoned.add(batch.id)
        fleet.kill(replica, kill_s)
        (self._kill if running else self._stop).append(replica)

    def drop_abandoned(self, batch_id: int) -> bool:
        """Whether batch ``batch_id`` was abandoned when its replica was killed (its end,
        when the driver sees it, changes nothing); forgets it.
        """
        if batch_id in self.abandoned:
            self.abandoned.discard(batch_id)
            return True
        return False

    def _stop_if_drained(self, replica: int, now_s: float) -> None:
        fleet = self.fleet
        assert fleet is not None
        if fleet.state[replica] == DRAINING and self.dispatcher.running[replica] == 0 \
                and fleet.stop_poll_s is None:  # else its next stop poll stops it
            fleet.stop(replica, now_s)
            self._stop.append(replica)

    def route_candidates(self) -> list[int]:
        """The replicas an arrival may be routed to (:meth:`sim.serving.fleet.Fleet.candidates`)."""
        fleet = self.fleet
        assert fleet is not None
        per_slot = [q.length for q in self.queues] if len(self.queues) > 1 else \
            [0] * self.n_replicas
        return fleet.candidates(per_slot)

    def _consult_fed(self, queues: set[int] | frozenset[int], now_s: float,
                     started: list[Batch], consulted: set[int] | None = None) -> None:
        """Consult the free replicas of ``queues`` (queues that received requests), those
        not in ``consulted`` (the replicas already asked this step, which it then holds).
        """
        running, max_running = self.dispatcher.running, self.dispatcher.max_running
        for q in sorted(queues) if len(queues) > 1 else queues:
            for replica in self.replicas_of[q]:
                if running[replica] < max_running[replica] and (
                        consulted is None or replica not in consulted):
                    if consulted is not None:
                        consulted.add(replica)
                    self._consult(replica, now_s, started)

    def _consult(self, replica: int, now_s: float, started: list[Batch]) -> None:
        dispatcher = self.dispatcher
        running, max_running = dispatcher.running, dispatcher.max_running
        if running[replica] >= max_running[replica]:
            return
        if self.fleet is not None and self.fleet.state[replica] != READY:
            raise InvariantError(f"replica {replica} is {self.fleet.state[replica]} but "
                                 "could take a batch")
        wake_at = self.wake_at_s
        while running[replica] < max_running[replica]:
            batch, wake_s = dispatcher.decide(replica, now_s)
            if batch is None:
                self._set_wake(replica, math.inf if wake_s is None else wake_s)
                return
            if wake_at[replica] != math.inf:
                self._set_wake(replica, math.inf)
            started.append(batch)

    def _set_wake(self, replica: int, wake_s: float) -> None:
        """Record a policy's wake-up (inf: none), keeping the earliest of all."""
        wake_at = self.wake_at_s
        old_s = wake_at[replica]
        if old_s == wake_s:
            return
        wake_at[replica] = wake_s
        if wake_s < self._min_wake_s:
            self._min_wake_s = wake_s
        elif old_s == self._min_wake_s:
            self._min_wake_s = min(wake_at)

    def next_wake_s(self) -> float:
        """When the core next needs a call without a finish: the next arrival while some
        replica is free, or the earliest policy wake-up.
        """
        wake_s = self._min_wake_s
        fleet = self.fleet
        if self.dispatcher.free_replicas > 0 or (fleet is not None and fleet.empty()):
            arrival_s = self.source.peek_s()
            if arrival_s < wake_s:
                wake_s = arrival_s
        if self.admission.tasks is not None:  # a routing task wakes (it may place work)
            retry_s = self.admission.next_retry_s()
            if retry_s < wake_s:
                wake_s = retry_s
        if fleet is not None:
            if fleet.next_tick_s < wake_s and self._ticking():
                wake_s = fleet.next_tick_s
            poll_s = fleet.next_poll_s()
            if poll_s < wake_s:
                wake_s = poll_s
        return wake_s

    def next_policy_wake_s(self) -> float:
        """The earliest wake-up a policy asked for (inf: none)."""
        return self._min_wake_s

    # -- what drivers and reports read -------------------------------------------------------
    @property
    def batches(self) -> BatchTable:
        """The batch records."""
        return self.dispatcher.batches

    @property
    def running(self) -> list[int]:
        """Batches running per replica."""
        return self.dispatcher.running

    @property
    def running_batches(self) -> list[dict[int, Batch]]:
        """Running batches per replica, by batch id."""
        return self.dispatcher.running_batches

    def free(self, replica: int) -> bool:
        """Whether the replica may start another batch."""
        return self.dispatcher.free(replica)

    def any_free(self) -> bool:
        """Whether some replica may start a batch."""
        return self.dispatcher.free_replicas > 0

    def loads(self, now_s: float) -> list[ReplicaLoad]:
        """Per-replica load at ``now_s`` (what routers see)."""
        return self.dispatcher.loads(now_s)

    def queued(self) -> int:
        """Requests waiting in all queues and at the router (``max_ongoing``)."""
        return sum(q.length for q in self.queues) + self.admission.n_held

    def admit_until(self, now_s: float) -> None:
        """Apply arrivals and expiries up to ``now_s`` without consulting any policy (a live
        run about to stop admitting takes in what was already due).
        """
        self.admission.admit_until(now_s)

    def fail_running(self, batch: Batch, time_s: float, reason: str) -> None:
        """Fail a running batch's requests now (e.g. a batch timeout); the replica stays busy
        until the batch is reported finished.
        """
        self.dispatcher.fail_running(batch, time_s, reason)

    def check_invariants(self) -> dict[str, int]:
        """Check request conservation; return the status counts (see
        :func:`sim.serving.invariants.check_invariants`).
        """
        return check_invariants(self.table, self.source.admitted, self.queues,
                                self.dispatcher.running_requests(), self.admission.n_held)
