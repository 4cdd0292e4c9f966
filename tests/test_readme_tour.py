"""The README's Tour runs as written: every command in it, in an empty directory, in order.

The commands are read from README.md (its "## Tour" section), so the README cannot drift from
what works. The only change the test makes is to add ``--set`` flags that shorten a run
(fewer requests, a shorter live schedule); nothing else is added or removed.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# command word(s) -> the --set flags that shorten it (the only change the test makes)
SHORTER: dict[str, list[str]] = {
    "simulate": ["--set", "workload.n_requests=20000"],  # only where the Tour sets it
    "sweep": ["--set", "workload.duration_s=20"],
    "capacity": ["--set", "workload.duration_s=20"],
    "replicas": ["--set", "workload.duration_s=20"],
    "live": ["--set", "workload.duration_s=4", "--set", "warmup_s=1"],
    "compare": ["--set", "workload.duration_s=4", "--set", "warmup_s=1"],
}
MODEL_COMMANDS = ("calibrate", "live", "compare", "profile compare")


def tour_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Tour\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def tour_commands() -> list[list[str]]:
    """The ``servelab`` commands of the Tour's bash blocks, continuation lines joined."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", tour_section(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                assert words[0] == "servelab", f"not a servelab command: {line}"
                commands.append(words)
    return commands


def tour_failures() -> list[tuple[list[str], str]]:
    """The ``$ servelab ...`` examples of the Tour that end in an error, with the error."""
    found = []
    for block in re.findall(r"```\n(\$ servelab.*?)```", tour_section(), re.S):
        first, output = block.splitlines()[0], block.splitlines()[1]
        found.append((shlex.split(first[2:]), output))
    return found


def shortened(words: list[str]) -> list[str]:
    verb = words[1]
    if verb == "simulate" and not any("n_requests" in w for w in words):
        return words
    return words + SHORTER.get(verb, [])


def run(words: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    return subprocess.run([sys.executable, "-m", "servelab.cli", *words[1:]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def is_model_command(words: list[str]) -> bool:
    return " ".join(words[1:3]).startswith(MODEL_COMMANDS)


def test_the_tour_has_the_commands_a_newcomer_needs() -> None:
    verbs = {" ".join(w[1:2]) for w in tour_commands()}
    assert {"init", "simulate", "sweep", "capacity", "replicas", "calibrate", "live",
            "compare"} <= verbs
    assert all("my.yaml" in w or w[1] in ("init", "scenarios", "profile", "calibrate")
               for w in tour_commands())  # every scenario the Tour uses is one it wrote
    assert tour_failures(), "the Tour shows what replicas says when replicas cannot help"


@pytest.mark.slow
def test_the_tour_simulator_commands_run_as_written(tmp_path: Path) -> None:
    for words in [w for w in tour_commands() if not is_model_command(w)]:
        done = run(shortened(words), tmp_path)
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"{' '.join(words)}:\n{output}"
        assert "Traceback" not in output and "error:" not in output, output
    assert (tmp_path / "my.yaml").is_file()
    assert (tmp_path / "runs" / "first" / "requests.csv").is_file()
    assert not (tmp_path / "runs" / "first" / "requests.parquet").exists()
    assert (tmp_path / "runs" / "replicas" / "replicas.json").is_file()
    assert (tmp_path / "runs" / "cap" / "capacity.json").is_file()
    for words, shown in tour_failures():
        done = run(shortened(words), tmp_path)
        lines = [line for line in (done.stdout + done.stderr).splitlines()
                 if line.startswith("error:")]
        assert done.returncode != 0 and len(lines) == 1, done.stdout + done.stderr
        assert lines[0].startswith(shown.split(" (")[0]), (lines, shown)


@pytest.mark.slow
def test_the_tour_model_commands_run_as_written(tmp_path: Path) -> None:
    assert run(["servelab", "init"], tmp_path).returncode == 0
    for words in [w for w in tour_commands() if is_model_command(w)]:
        done = run(shortened(words), tmp_path)
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"{' '.join(words)}:\n{output}"
        assert "Traceback" not in output, output
    assert (tmp_path / "profiles" / "mlp-mine.json").is_file()
    assert (tmp_path / "runs" / "live" / "summary.json").is_file()
    assert (tmp_path / "runs" / "cmp" / "compare.json").is_file()
