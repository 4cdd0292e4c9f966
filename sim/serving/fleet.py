"""The replica fleet under an autoscaler: each replica slot's state, and its history.

A slot is ``off``, ``starting`` (launched, in its cold start), ``ready`` (serving) or
``draining`` (removed: takes no new work, finishes what runs, then goes ``off``; with a
stop poll period it goes ``off`` only at the first poll that finds it idle, each poll a period
after the last, the first a period after its removal, as Ray Serve's replica checks every
``graceful_shutdown_wait_loop_s``, sleeping first, before it shuts down; with a kill
timeout a draining slot still not stopped that long after its removal is killed then, as Ray
Serve's controller force-kills a replica past ``graceful_shutdown_timeout_s``). The fleet
has no clock: the core tells it the time. A scale-down cancels starting slots before it
retires ready ones, as Ray Serve 2.60 stops replicas that are not running yet first
(:meth:`Fleet.plan`); a cancelled slot goes ``off`` at once (it never served). It records
every change as an event (``time_s, replica, event``) and the counts as a step series;
replica-seconds integrate the replicas that hold resources (starting, ready or draining).

A draining slot is not off, so a launch cannot take it: with as many slots as the
autoscaler's ``max_replicas`` a scale-up right after a scale-down waits for the removed
replica to stop. Ray Serve 2.60 counts only starting and running replicas against the
target (``DeploymentState._get_target_replica_delta``: STARTING, UPDATING, RUNNING and
RECOVERING, not STOPPING), so it launches at once: a fleet given ``2 * max_replicas``
slots does the same (the autoscaler's bound keeps ready + starting within
``max_replicas``; the extra slots hold removed replicas while they stop). A control that
wants more launches than there are off slots is recorded in ``FleetLog.slot_waits``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sim.serving.autoscaling import Autoscaler, FleetView

OFF, STARTING, READY, DRAINING = "off", "starting", "ready", "draining"
RETIRE_RULES = ("least_loaded", "newest")  # Fleet(retire_rule=...): which ready slot goes


@dataclass
class FleetLog:
    """The fleet's history.

    Attributes:
        events: ``(time_s, replica, event)`` with event in deploy (resident from the start) |
            launch | ready | cancel (a starting slot removed before it was ready: off at
            once) | retire | stop | kill (a draining slot ended at its kill timeout: off
            at once, what it ran abandoned).
        times_s, ready, starting, draining: The counts after each change (a step series).
        controls: Per consultation of the autoscaler, ``(time_s, seen_s, ongoing, replicas,
            desired)``: the time it decided for (a control tick, or an arrival to an empty
            fleet), the driver's clock when it was asked (later than ``time_s`` by a live
            loop's lateness; equal in the simulator), what its view held and its answer.
            None (the default): not recorded (a simulated day would hold a row per tick);
            the live executor records them (a test compares them with the run's records).
        slot_waits: ``(time_s, launches)``: a consultation that wanted more launches than
            there were off slots (the rest wait for draining slots to stop; the autoscaler
            is asked again at the next control tick).
    """

    events: list[tuple[float, int, str]] = field(default_factory=list)
    controls: list[tuple[float, float, int, int, int]] | None = None
    times_s: list[float] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    starting: list[int] = field(default_factory=list)
    draining: list[int] = field(default_factory=list)
    slot_waits: list[tuple[float, int]] = field(default_factory=list)

    def series(self) -> pd.DataFrame:
        """The replica counts over time (``replicas`` = starting + ready + draining)."""
        frame = pd.DataFrame({"time_s": np.asarray(self.times_s, dtype=float),
                              "ready": np.asarray(self.ready, dtype=np.int64),
                              "starting": np.asarray(self.starting, dtype=np.int64),
                              "draining": np.asarray(self.draining, dtype=np.int64)})
        frame["replicas"] = frame["ready"] + frame["starting"] + frame["draining"]
        return frame

    def event_frame(self) -> pd.DataFrame:
        """The events as a table."""
        return pd.DataFrame(self.events, columns=["time_s", "replica", "event"])


class Fleet:
    """Replica slots and the autoscaler that sizes them.

    Args:
        n_slots: Slots: the autoscaler's ``max_replicas`` (a removed replica holds one until
            it stops, as a launch then waits), or more (``2 * max_replicas``: a launch takes
            an off slot while removed replicas stop in the others, as Ray Serve's does).
        autoscaler: The policy.
        control_period_s: How often the autoscaler is consulted.
        stop_poll_s: A draining replica stops at the first poll that finds it idle, polls
            ``stop_poll_s`` apart from its removal (None: as soon as its work is done).
        outside_s: The autoscaler counts each request as ongoing also this long after its
            batch ends (the path outside the replica that Ray Serve's count holds).
        retire_rule: Which ready slots a scale-down retires: ``least_loaded`` (fewest
            requests queued, then the highest) or ``newest`` (the one that became ready
            last, then the highest: Ray Serve's order on one node).
        kill_after_s: A draining slot not stopped this long after its removal is killed
            then (Ray Serve's ``graceful_shutdown_timeout_s``); None: never.
    """

    def __init__(self, n_slots: int, autoscaler: Autoscaler, control_period_s: float,
                 stop_poll_s: float | None = None, outside_s: float = 0.0,
                 retire_rule: str = "least_loaded", kill_after_s: float | None = None) -> None:
        if retire_rule not in RETIRE_RULES:
            raise ValueError(f"retire_rule: {retire_rule!r} is not one of {RETIRE_RULES}")
        self.retire_rule = retire_rule
        self.kill_after_s = kill_after_s
        self.kill_at_s = [math.inf] * n_slots  # a draining slot's kill deadline
        self.autoscaler = autoscaler
        self.outside_s = outside_s  # a request counts as ongoing this long after its batch
        self.control_period_s = control_period_s
        self.stop_poll_s = stop_poll_s
        self.poll_at_s = [math.inf] * n_slots  # a draining slot's next stop poll
        self.state = [OFF] * n_slots
        self.ready_at_s = [math.nan] * n_slots  # the current incarnation's ready time
        self.launched_at_s = [math.nan] * n_slots  # the current incarnation's launch time
        self.log = FleetLog()
        self.next_tick_s = control_period_s
        for r in range(min(autoscaler.initial_replicas, n_slots)):
            self.state[r] = READY  # deployed before the run: resident, no cold start
            self.ready_at_s[r] = 0.0
            self.log.events += [(0.0, r, "deploy"), (0.0, r, "ready")]
        self._record(0.0)

    # -- state ------------------------------------------------------------------------------
    def count(self, state: str) -> int:
        """Slots in ``state``."""
        return self.state.count(state)

    def slots(self, state: str) -> list[int]:
        """Slots in ``state``, by index."""
        return [r for r, s in enumerate(self.state) if s == state]

    def empty(self) -> bool:
        """No replica ready or starting."""
        return not any(s in (READY, STARTING) for s in self.state)

    def view(self, now_s: float, queued: int, running: int) -> FleetView:
        """What the autoscaler sees now."""
        return FleetView(now_s, self.count(READY), self.count(STARTING), queued, running)

    def candidates(self, held_per_slot: list[int]) -> list[int]:
        """Where an arrival may go: the ready slots; if none, the starting ones (it waits
        for a cold start); if none, the slot the next launch takes (the off slot holding the
        most requests, then the lowest; :meth:`plan` launches in the same order).
        """
        for state in (READY, STARTING):
            slots = self.slots(state)
            if slots:
                return slots
        off = sorted(self.slots(OFF), key=lambda r: (-held_per_slot[r], r))
        return off[:1] or [0]

    # -- changes ----------------------------------------------------------------------------
    def plan(self, view: FleetView, queued_per_slot: list[int],
             seen_s: float | None = None) -> tuple[list[int], list[int], list[int]]:
        """Ask the autoscaler; return (slots to launch, starting slots to cancel, ready slots
        to retire).

        ``seen_s`` is the driver's clock when it asked (recorded in ``log.controls``;
        None: ``view.now_s``).

        Launches take off slots holding queued requests first (requests routed while the
        fleet was empty), then the lowest. A scale-down takes starting slots first, the most
        recently launched (then the highest) first, then ready slots: with the
        ``least_loaded`` rule the least loaded and then the highest first; with ``newest``
        the one that became ready last (its current incarnation), then the highest (the
        resident slots all became ready at 0). Ray Serve 2.60 does the same in kind:
        ``DeploymentScheduler._get_replicas_to_stop`` puts the replicas that are not running
        (pending allocation, launching, recovering) ahead of the running ones; among those
        it takes whatever order a set gives, so the newest-first rule here is servelab's
        (the one Ray applies to its running replicas on a node), a deterministic choice
        that cancels the launch furthest from ready when cold starts are alike. Among ready
        slots Ray takes the newest on the emptiest node (``_running_replicas`` keeps the
        order they became running; it walks it reversed): servelab has no nodes, so
        ``newest`` is Ray's rule on one node; ``least_loaded`` (the default) has the
        fewest requests to finish while draining.

        A cancelled slot holds requests only when no slot was ready (:meth:`candidates`
        sends arrivals to starting slots then). Ray never gives a request to a replica that
        is not running: its router holds the request until one is. The core hands such a
        slot's requests back to :meth:`candidates` at the cancel, which is where Ray's
        router would send them when a replica comes up, so the scale-down decision does not
        depend on what the slot holds.
        """
        want = self.autoscaler.desired(view)
        have = view.replicas
        if self.log.controls is not None:
            self.log.controls.append((view.now_s, view.now_s if seen_s is None else seen_s,
                                      view.ongoing, have, want))
        if want > have:
            off = sorted(self.slots(OFF), key=lambda r: (-queued_per_slot[r], r))
            if len(off) < want - have:  # draining slots hold the rest
                self.log.slot_waits.append((view.now_s, want - have - len(off)))
            return off[:want - have], [], []
        if want < have:
            excess = have - want
            starting = sorted(self.slots(STARTING),
                              key=lambda r: (-self.launched_at_s[r], -r))[:excess]
            if self.retire_rule == "newest":
                ready = sorted(self.slots(READY), key=lambda r: (-self.ready_at_s[r], -r))
            else:
                ready = sorted(self.slots(READY), key=lambda r: (queued_per_slot[r], -r))
            return [], starting, ready[:excess - len(starting)]
        return [], [], []

    def _move(self, replica: int, now_s: float, state: str, event: str) -> None:
        """Put a slot in ``state``, logging ``event`` and the new counts."""
        self.state[replica] = state
        self.log.events.append((now_s, replica, event))
        self._record(now_s)

    def launch(self, replica: int, now_s: float) -> None:
        """A slot starts its cold start."""
        self.launched_at_s[replica] = now_s
        self._move(replica, now_s, STARTING, "launch")

    def cancel(self, replica: int, now_s: float) -> None:
        """A starting slot is removed before its cold start ends: it goes off now (it never
        served, so there is nothing to drain); its replica-seconds stop here. The driver
        must drop the launch (its ready report, when it comes, is not this slot's).
        """
        if self.state[replica] != STARTING:
            raise ValueError(f"replica {replica} is {self.state[replica]}, not starting")
        self.launched_at_s[replica] = math.nan
        self._move(replica, now_s, OFF, "cancel")

    def cancel_for(self, replica: int, now_s: float, launched: list[int],
                   cancelled: list[int]) -> None:
        """:meth:`cancel`, and tell the driver: a launch of this same step (in
        ``launched``, which the driver has not seen) is dropped from it; else the slot is
        listed in ``cancelled`` for the driver to drop its load.
        """
        self.cancel(replica, now_s)
        if replica in launched:
            launched.remove(replica)
        else:
            cancelled.append(replica)

    def ready(self, replica: int, now_s: float) -> None:
        """A starting slot's model is loaded: it serves from now."""
        if self.state[replica] != STARTING:  # e.g. a cancelled launch's late report
            raise ValueError(f"replica {replica} is {self.state[replica]}, not starting")
        self.ready_at_s[replica] = now_s
        self._move(replica, now_s, READY, "ready")

    def retire(self, replica: int, now_s: float) -> None:
        """A ready slot stops taking work (its first stop poll a period later, its kill
        deadline ``kill_after_s`` later).
        """
        if self.stop_poll_s is not None:
            self.poll_at_s[replica] = now_s + self.stop_poll_s
        if self.kill_after_s is not None:
            self.kill_at_s[replica] = now_s + self.kill_after_s
        self._move(replica, now_s, DRAINING, "retire")

    def stop(self, replica: int, now_s: float) -> None:
        """A draining slot has finished its work and frees its resources."""
        self.poll_at_s[replica] = math.inf
        self.kill_at_s[replica] = math.inf
        self._move(replica, now_s, OFF, "stop")

    def kill(self, replica: int, now_s: float) -> None:
        """A draining slot reached its kill deadline: it goes off now; the driver abandons
        what it was running.
        """
        if self.state[replica] != DRAINING:
            raise ValueError(f"replica {replica} is {self.state[replica]}, not draining")
        self.poll_at_s[replica] = math.inf
        self.kill_at_s[replica] = math.inf
        self._move(replica, now_s, OFF, "kill")

    def next_poll_s(self) -> float:
        """The earliest stop poll or kill deadline of a draining slot (inf: none)."""
        poll_s = min(self.poll_at_s) if self.stop_poll_s is not None else math.inf
        if self.kill_after_s is not None:
            return min(poll_s, min(self.kill_at_s))
        return poll_s

    def poll(self, now_s: float, busy: list[int]) -> list[int]:
        """Run the stop polls due by ``now_s``, in time order: a draining slot with no work
        (``busy[r] == 0``) stops at its poll's time, one with work polls again a period later.
        Polls after a slot's kill deadline are not run: :meth:`kills_due`, called next,
        kills it at the deadline (a poll at the deadline itself stops an idle slot first).

        Returns:
            The slots stopped.
        """
        period = self.stop_poll_s
        if period is None:
            return []
        stopped = []
        kill_at_s = self.kill_at_s
        for r in sorted(range(len(self.state)), key=lambda k: self.poll_at_s[k]):
            at_s = self.poll_at_s[r]
            if at_s > now_s:
                break
            if at_s > kill_at_s[r]:
                continue
            if busy[r] == 0:
                self.stop(r, at_s)
                stopped.append(r)
            else:
                while self.poll_at_s[r] <= now_s and self.poll_at_s[r] <= kill_at_s[r]:
                    self.poll_at_s[r] += period
        return stopped

    def kills_due(self, now_s: float) -> list[tuple[int, float]]:
        """The draining slots whose kill deadline is due by ``now_s`` and comes before their
        next stop poll (call :meth:`poll` first), with the deadline, in time order. The
        caller abandons their work and calls :meth:`kill`.
        """
        if self.kill_after_s is None:
            return []
        due = [(at_s, r) for r, at_s in enumerate(self.kill_at_s)
               if at_s <= now_s and at_s < self.poll_at_s[r]]
        return [(r, at_s) for at_s, r in sorted(due)]

    def _record(self, now_s: float) -> None:
        log = self.log
        if log.times_s and log.times_s[-1] == now_s:  # one row per instant: the last state
            log.ready.pop()
            log.starting.pop()
            log.draining.pop()
            log.times_s.pop()
        log.times_s.append(now_s)
        log.ready.append(self.count(READY))
        log.starting.append(self.count(STARTING))
        log.draining.append(self.count(DRAINING))


class ColdStart:
    """A new replica's cold start: a bootstrap draw from measured load times, else a
    constant.
    """

    def __init__(self, samples_s: np.ndarray, constant_s: float,
                 rng: np.random.Generator) -> None:
        self.samples_s = np.asarray(samples_s, dtype=float)
        self.constant_s = float(constant_s)
        self.rng = rng

    def __repr__(self) -> str:
        if self.samples_s.size:
            return (f"ColdStart({self.samples_s.size} measured, median "
                    f"{float(np.median(self.samples_s)):.3g} s)")
        return f"ColdStart({self.constant_s:g} s)"

    def sample_s(self) -> float:
        """One cold start in seconds."""
        if self.samples_s.size:
            return float(self.samples_s[self.rng.integers(self.samples_s.size)])
        return self.constant_s


def replica_seconds(series: pd.DataFrame, lo_s: float, hi_s: float) -> float:
    """The integral of ``replicas`` (starting + ready + draining) over [lo, hi] of a step
    series from :meth:`FleetLog.series`.
    """
    if hi_s <= lo_s or series.empty:
        return 0.0
    t = series["time_s"].to_numpy(float)
    n = series["replicas"].to_numpy(float)
    edges = np.clip(np.append(t, hi_s), lo_s, hi_s)
    return float(np.sum(n * np.diff(edges)))


def cold_start_waited(requests: pd.DataFrame, events: pd.DataFrame) -> np.ndarray:
    """Per request: whether its wait included a cold start (the replica that started it
    became ready after the request arrived).
    """
    waited = np.zeros(len(requests), dtype=bool)
    ready = events[events["event"] == "ready"]
    if ready.empty or not len(requests):
        return waited
    start = requests["start_s"].to_numpy(dtype=float, na_value=np.nan)
    replica = requests["replica"].to_numpy()
    arrival = requests["arrival_s"].to_numpy()
    for r, group in ready.groupby("replica"):
        times = np.sort(group["time_s"].to_numpy(float))
        mine = (replica == r) & np.isfinite(start)
        k = np.searchsorted(times, start[mine], side="right") - 1
        served_by = np.where(k >= 0, times[np.clip(k, 0, None)], -np.inf)
        waited[np.flatnonzero(mine)] = served_by > arrival[mine]
    return waited


def fleet_summary(requests: pd.DataFrame, series: pd.DataFrame, events: pd.DataFrame,
                  lo_s: float, hi_s: float, latency_s: np.ndarray,
                  ok_mask: np.ndarray) -> dict[str, object]:
    """The autoscaling metrics over the window [lo, hi].

    Args:
        requests: The request table.
        series: Replica counts over time (:meth:`FleetLog.series`).
        events: Fleet events (:meth:`FleetLog.event_frame`).
        lo_s: The measurement window's start.
        hi_s: Its end.
        latency_s: Latencies of the ok requests in the window (for the tail share).
        ok_mask: Which rows of ``requests`` those are (same order as ``latency_s``).
    """
    span = hi_s - lo_s
    seconds = replica_seconds(series, lo_s, hi_s)
    t = series["time_s"].to_numpy(float)
    n = series["replicas"].to_numpy()
    inside = n[(t >= lo_s) & (t <= hi_s)]
    at_lo = n[max(int(np.searchsorted(t, lo_s, side="right")) - 1, 0)] if n.size else 0
    counts = np.append(inside, at_lo)
    launches = events[events["event"] == "launch"]
    in_win = launches[(launches["time_s"] >= lo_s) & (launches["time_s"] <= hi_s)]
    waited = cold_start_waited(requests, events)
    arrived = requests["arrival_s"].to_numpy() >= lo_s
    ok_waited = waited[ok_mask]
    tail_share = float("nan")
    if latency_s.size:
        tail = latency_s >= np.percentile(latency_s, 99)
        tail_share = float(ok_waited[tail].mean()) if tail.any() else float("nan")
    loads = _load_times_s(events)
    empty = empty_fleet_waits_s(requests, series, lo_s, hi_s)
    return {
        "replica_seconds": seconds,
        "replicas": {"mean": seconds / span if span > 0 else float("nan"),
                     "min": int(counts.min()) if counts.size else 0,
                     "max": int(counts.max()) if counts.size else 0},
        "cold_starts": len(in_win),
        "cold_start_s": {"count": len(loads),
                         "p50": float(np.median(loads)) if loads.size else float("nan"),
                         "max": float(loads.max()) if loads.size else float("nan")},
        "cold_start_waits": int(np.sum(waited & arrived)),
        "cold_start_wait_share": float(np.mean(waited[arrived])) if arrived.any()
        else float("nan"),
        "cold_start_tail_share": tail_share,
        "empty_fleet_wait_s": {"episodes": int(empty.size),
                               "mean": float(empty.mean()) if empty.size else float("nan"),
                               "max": float(empty.max()) if empty.size else float("nan")},
    }


def empty_fleet_waits_s(requests: pd.DataFrame, series: pd.DataFrame, lo_s: float,
                        hi_s: float) -> np.ndarray:
    """Per episode with no ready replica: from the first arrival in it to the first replica
    ready (how long the head of a burst waits after scale to zero, or after a fleet too
    small to have anyone ready); arrivals in [lo, hi].
    """
    t = series["time_s"].to_numpy(float)
    ready = series["ready"].to_numpy()
    arrival = np.sort(requests["arrival_s"].to_numpy(float))
    arrival = arrival[(arrival >= lo_s) & (arrival <= hi_s)]
    if not arrival.size or not t.size:
        return np.empty(0)
    k = np.searchsorted(t, arrival, side="right") - 1
    none_ready = ready[np.clip(k, 0, None)] == 0
    ready_times = t[ready > 0]
    waits: dict[float, float] = {}
    for a in arrival[none_ready]:
        j = np.searchsorted(ready_times, a, side="right")
        if j < ready_times.size:
            waits.setdefault(float(ready_times[j]), a)  # the episode's first arrival
    return np.array([r - a for r, a in waits.items()], dtype=float)


def _load_times_s(events: pd.DataFrame) -> np.ndarray:
    """Launch-to-ready times of the launches during the run (not the resident deploys)."""
    out = []
    for _, group in events.groupby("replica"):
        pending = None
        for time_s, event in zip(group["time_s"], group["event"], strict=True):
            if event == "launch":
                pending = time_s
            elif event == "cancel":  # never loaded: no load time
                pending = None
            elif event == "ready" and pending is not None:
                out.append(time_s - pending)
                pending = None
    return np.asarray(out, dtype=float)
