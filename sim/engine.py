"""The SimPy driver: simulated time around :class:`sim.core.ServingCore`.

Three kinds of SimPy event, each a plain ``Timeout`` with a callback (no process per request):

* an *arrival tick* at the next arrival time, scheduled only while some replica is free
  (an arrival that finds every replica busy just joins its queue when the core next looks);
* a *batch done* event per dispatched batch, after a service time drawn from the model;
* a *wake-up* per replica when a policy asked for one (superseded by any later decision).

The policy is consulted exactly on the events of the design: an arrival while its replica is
free, a replica becoming free, and a wake-up falling due.
"""

from __future__ import annotations

import math
from typing import cast

import simpy

from sim.core import Batch, ServingCore
from sim.service import ServiceModel


class SimPyDriver:
    """Runs a :class:`ServingCore` in simulated time."""

    def __init__(self, core: ServingCore, service: ServiceModel) -> None:
        self.core = core
        self.service = service
        self.env = simpy.Environment()
        self._tick_pending = False
        n = core.n_replicas
        self._wake_token = [0] * n
        self._wake_at_s = [math.nan] * n
        self._idle_since_s = [0.0] * n  # when each replica last became idle

    def run(self, until_s: float | None = None) -> float:
        """Simulate until no event is left (or until ``until_s``); return the final simulated
        time (s). Work still queued or running at ``until_s`` stays unfinished.
        """
        self._schedule_tick()
        env = self.env
        if until_s is None:
            env.run()
            return float(env.now)
        while env.peek() <= until_s:
            env.step()
        return float(env.now) if env.peek() == math.inf else float(until_s)

    # -- scheduling --------------------------------------------------------------------------
    def _schedule_tick(self) -> None:
        if self._tick_pending or not self.core.any_free():
            return
        arrival_s = self.core.next_arrival_s()
        if arrival_s == math.inf:
            return
        self._tick_pending = True
        event = self.env.timeout(max(0.0, arrival_s - self.env.now), arrival_s)
        event.callbacks.append(self._on_tick)

    def _consult(self, replica: int, now_s: float) -> None:
        core, env = self.core, self.env
        while core.free(replica):
            batch, wake_s = core.decide(replica, now_s)
            if batch is None:
                if wake_s is None:
                    self._wake_token[replica] += 1
                    self._wake_at_s[replica] = math.nan
                elif wake_s != self._wake_at_s[replica]:
                    self._wake_token[replica] += 1
                    self._wake_at_s[replica] = wake_s
                    event = env.timeout(wake_s - now_s,
                                        (replica, self._wake_token[replica], wake_s))
                    event.callbacks.append(self._on_wake)
                return
            self._wake_token[replica] += 1
            self._wake_at_s[replica] = math.nan
            first = core.running[replica] == 1  # this batch ends an idle period
            idle_s = now_s - self._idle_since_s[replica] if first else 0.0
            service_s = self.service.sample_s(batch.items, idle_s)
            event = env.timeout(service_s, (batch, service_s))
            event.callbacks.append(self._on_done)

    def _consult_touched(self, touched: set[int], now_s: float, skip: int = -1) -> None:
        for replica in self.core.free_replicas_of(touched, skip):
            self._consult(replica, now_s)

    # -- callbacks ---------------------------------------------------------------------------
    # Events carry their exact target time: ``now + (t - now)`` can round below ``t``, and a
    # policy must see ``now_s >= t`` when its wake-up (or an arrival) falls due.
    def _on_tick(self, event: simpy.Event) -> None:
        self._tick_pending = False
        now_s = max(self.env.now, cast(float, event.value))
        self._consult_touched(self.core.admit_until(now_s), now_s)
        self._schedule_tick()

    def _on_done(self, event: simpy.Event) -> None:
        batch: Batch
        batch, service_s = cast(tuple[Batch, float], event.value)
        now_s = self.env.now
        core = self.core
        core.finish(batch, now_s, service_s)
        if core.running[batch.replica] == 0:
            self._idle_since_s[batch.replica] = now_s
        touched = core.admit_until(now_s)
        self._consult(batch.replica, now_s)
        if touched:
            self._consult_touched(touched, now_s, skip=batch.replica)
        self._schedule_tick()

    def _on_wake(self, event: simpy.Event) -> None:
        replica, token, wake_s = cast(tuple[int, int, float], event.value)
        if token != self._wake_token[replica] or not self.core.free(replica):
            return
        self._wake_at_s[replica] = math.nan
        now_s = max(self.env.now, wake_s)
        touched = self.core.admit_until(now_s)
        self._consult(replica, now_s)
        if touched:
            self._consult_touched(touched, now_s, skip=replica)
        self._schedule_tick()
