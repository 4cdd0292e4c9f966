"""``read_decisions``: Ray's controller decision lines parsed into ``ray_decisions.csv``'s
rows (no Ray needed): the time from the log's local asctime, the counts, the printed total,
other lines ignored and a line logged in two files kept once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from executor.endpoint.autoscale_check import read_decisions, router_warnings

LINE = ("INFO {stamp},{ms} controller 123 -- deployment_state.py:2000 - {kind}scaling "
        "Deployment(name='Model', app='servelab') from {old} to {new} replicas. "
        "Current ongoing requests: {z}, current running replicas: {r}.")


def test_decision_lines_become_rows(tmp_path: Path) -> None:
    logs = tmp_path / "session_1" / "logs" / "serve"
    logs.mkdir(parents=True)
    t0_unix = time.mktime(time.strptime("2026-12-07 08:00:00", "%Y-%m-%d %H:%M:%S"))
    up = LINE.format(stamp="2026-12-07 08:00:04", ms="570", kind="Up", old=1, new=4,
                     z="19.35", r=1)
    down = LINE.format(stamp="2026-12-07 08:00:18", ms="100", kind="Down", old=4, new=1,
                       z="0.56", r=4)
    other = "INFO 2026-12-07 08:00:05,000 controller -- Adding 3 replicas to Deployment"
    (logs / "controller_1.log").write_text("\n".join([up, other, down]) + "\n")
    (logs / "controller_2.log").write_text(up + "\n")  # the same line in a second file
    frame = read_decisions(tmp_path, t0_unix)
    assert frame.to_dict("records") == [
        {"time_s": pytest.approx(4.57), "old": 1, "new": 4, "ongoing": 19.35, "running": 1},
        {"time_s": pytest.approx(18.1), "old": 4, "new": 1, "ongoing": 0.56, "running": 4}]
    assert read_decisions(tmp_path / "none", t0_unix).empty


def test_router_warnings_count_rejections_and_late_probes_inside_the_day(
        tmp_path: Path) -> None:
    # the lines as Ray 2.60 logs them (replica.py handle_request_with_rejection;
    # request_router.py _probe_queue_lens); lines outside [t0, t0 + length] and other
    # warnings are not counted
    logs = tmp_path / "session_1" / "logs" / "serve"
    logs.mkdir(parents=True)
    t0_unix = time.mktime(time.strptime("2026-12-07 08:00:00", "%Y-%m-%d %H:%M:%S"))
    reject = ("WARNING {stamp},250 servelab_Model abc -- Replica at capacity of "
              "max_ongoing_requests=64, rejecting request 81d9.")
    late = ("WARNING {stamp},500 proxy 192.0.2.2 -- Failed to get queue length from "
            "Replica(id='abc', deployment='Model', app='servelab') within 0.1s.")
    (logs / "replica_servelab_Model_abc.log").write_text("\n".join([
        reject.format(stamp="2026-12-07 08:00:03"), reject.format(stamp="2026-12-07 08:00:09"),
        reject.format(stamp="2026-12-07 08:00:31"),  # after the day
        "WARNING 2026-12-07 08:00:04,000 servelab_Model abc -- something else"]) + "\n")
    (logs / "proxy_192.0.2.2.log").write_text("\n".join([
        late.format(stamp="2026-12-07 07:59:59"),  # before it
        late.format(stamp="2026-12-07 08:00:12")]) + "\n")
    assert router_warnings(tmp_path, t0_unix, 30.0) == {"rejected": 2, "probe_timeouts": 1}
    assert router_warnings(tmp_path / "none", t0_unix, 30.0) == {
        "rejected": 0, "probe_timeouts": 0}
