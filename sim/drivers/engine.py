"""The SimPy driver: simulated time around :meth:`sim.serving.core.ServingCore.step`.

Three kinds of SimPy event, each a plain ``Timeout`` with a callback (no process per request):

* a *batch done* event per started batch, after a service time drawn from the model (from
  its cold samples when the replica had idled long enough, see :attr:`Batch.idle_s`; a model
  with ``sample_batch_s(batch)``, a replay of measured batches, is given the batch itself);
* a *wake-up* at the time the core asked for (the next arrival while a replica is free, or a
  policy's wake-up); a later call that asks for another time supersedes it;
* a *replica ready* event per launched replica (autoscaling), after a cold start drawn from
  the model's measured load times; a launch the core cancels (a scale-down during its cold
  start) leaves its event pending, and the event, stamped with the launch's generation, is
  ignored when it fires (the slot may be off, or starting again on a later launch).

A batch abandoned when its replica was killed (``graceful_shutdown_timeout_s``) keeps its
pending *batch done* event; the event is dropped when it fires and does not count toward the
run's end time.

Everything else — admission, routing, which policy to ask and when — is the core's.
"""

from __future__ import annotations

import math

import simpy

from sim.scenario.service import ServiceModel
from sim.serving.core import CoreActions, Finished, ServingCore
from sim.serving.fleet import ColdStart

_finished = tuple.__new__  # a Finished without the NamedTuple's Python-level __new__


class SimPyDriver:
    """Runs a :class:`ServingCore` in simulated time."""

    def __init__(self, core: ServingCore, service: ServiceModel,
                 cold_start: ColdStart | None = None) -> None:
        self.core = core
        self.service = service
        self.cold_start = cold_start
        self.env = simpy.Environment()
        self._wake_token = 0
        self._wake_s = math.inf  # the pending wake-up
        self._launch_gen: dict[int, int] = {}  # per slot: its current launch's generation
        self._end_s = 0.0  # the last event's time (not an abandoned batch's, a stale wake-up's
        # or a cancelled launch's ready: events that change nothing)
        # a model that times each batch by more than its size and idle time (a replay of a
        # live run's batches, per replica) offers sample_batch_s
        self._by_batch = getattr(service, "sample_batch_s", None)

    def run(self, until_s: float | None = None) -> float:
        """Simulate until no event is left (or until ``until_s``); return the final simulated
        time (s). Work still queued or running at ``until_s`` stays unfinished, and every
        arrival up to ``until_s`` is in the records.
        """
        self._apply(self.core.step(0.0))
        env = self.env
        if until_s is None:
            env.run()
            return self._end_s
        while env.peek() <= until_s:
            env.step()
        if env.peek() == math.inf:
            return self._end_s
        # arrivals the core had no reason to wake for (every replica busy) are still due:
        # they arrived before the stop and are in the system (censored), as a live run's
        self.core.admit_until(until_s)
        return float(until_s)

    def _apply(self, actions: CoreActions) -> None:
        env, sample_s, by_batch = self.env, self.service.sample_s, self._by_batch
        for batch in actions.start:
            service_s = (sample_s(batch.items, batch.idle_s) if by_batch is None
                         else by_batch(batch))
            event = env.timeout(service_s, (batch, service_s))
            event.callbacks.append(self._on_done)
        gen = self._launch_gen
        for replica in actions.cancel:  # its pending ready event goes stale
            gen[replica] = gen.get(replica, 0) + 1
        for replica in actions.launch:
            assert self.cold_start is not None, "a fleet needs a cold-start model"
            gen[replica] = gen.get(replica, 0) + 1
            event = env.timeout(self.cold_start.sample_s(), (replica, gen[replica]))
            event.callbacks.append(self._on_ready)
        wake_s = actions.wake_s
        if wake_s != self._wake_s:
            self._wake_s = wake_s
            self._wake_token += 1
            if wake_s != math.inf:
                event = env.timeout(max(0.0, wake_s - env.now), (self._wake_token, wake_s))
                event.callbacks.append(self._on_wake)

    # Events carry their exact target time: ``now + (t - now)`` can round below ``t``, and a
    # policy must see ``now_s >= t`` when its wake-up (or an arrival) falls due.
    def _on_done(self, event: simpy.Event) -> None:
        batch, service_s = event.value  # type: ignore[misc]  # (Batch, float), as set
        if self.core.abandoned and self.core.drop_abandoned(batch.id):
            return  # its replica was killed: the core failed its requests then
        now_s = self._end_s = self.env.now
        self._apply(self.core.step(now_s, (_finished(Finished, (batch, now_s, service_s,
                                                                 None)),)))

    def _on_ready(self, event: simpy.Event) -> None:
        replica, gen = event.value  # type: ignore[misc]  # (int, int), as set
        if gen != self._launch_gen[replica]:
            return  # a cancelled launch (nothing happened: not the run's end either)
        now_s = self._end_s = self.env.now
        self._apply(self.core.step(now_s, ready=((replica, now_s),)))

    def _on_wake(self, event: simpy.Event) -> None:
        token, wake_s = event.value  # type: ignore[misc]  # (int, float), as set
        if token != self._wake_token:
            return  # a wake-up replaced by a later request (not the run's end either)
        self._end_s = self.env.now
        self._wake_s = math.inf
        self._apply(self.core.step(max(self.env.now, wake_s)))
