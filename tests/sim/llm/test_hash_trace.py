"""Hash-block traces: the three formats, block regrouping, timing-free hit rates, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from servelab.cli import app
from sim.scenario.hash_trace import engine_block_keys, read_hash_trace
from sim.scenario.trace_stats import hit_rate, trace_stats
from sim.scenario.workloads import WorkloadError


def jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def bailian(tmp_path: Path) -> Path:
    # chat 0 at 2 s: 40 tokens (blocks 1 2 + partial 3); chat 1 at 1 s; chat 2 extends chat 0
    return jsonl(tmp_path / "b.jsonl", [
        {"chat_id": 0, "parent_chat_id": -1, "timestamp": 2.0, "input_length": 40,
         "output_length": 5, "type": "text", "turn": 1, "hash_ids": [1, 2, 3]},
        {"chat_id": 1, "parent_chat_id": -1, "timestamp": 1.0, "input_length": 16,
         "output_length": 2, "type": "text", "turn": 1, "hash_ids": [9]},
        {"chat_id": 2, "parent_chat_id": 0, "timestamp": 3.0, "input_length": 64,
         "output_length": 7, "type": "text", "turn": 2, "hash_ids": [1, 2, 4, 5]}])


def test_bailian_rows_are_sorted_by_time_with_16_token_blocks(tmp_path: Path) -> None:
    t = read_hash_trace(bailian(tmp_path))
    assert t.fmt == "bailian" and t.block_size == 16
    assert list(t.arrival_s) == [1.0, 2.0, 3.0]
    assert list(t.prompt_tokens) == [16, 40, 64] and list(t.output_tokens) == [2, 5, 7]
    assert t.hash_ids[1] == (1, 2, 3)


def test_hit_rates_by_hand(tmp_path: Path) -> None:
    t = read_hash_trace(bailian(tmp_path))
    # request 3 (64 tokens) hits blocks 1, 2 (32 tokens); nothing else hits
    assert hit_rate(t) == pytest.approx(32 / 120)
    assert hit_rate(t, cache_blocks=0) == 0.0
    stats = trace_stats(t, [1, 100])
    assert stats["requests"] == 3 and stats["rate_rps"] == pytest.approx(1.0)
    assert stats["hit_rate_lru"]["100"] == pytest.approx(32 / 120)
    # one block keeps the root of the last prefix (touched last): request 3 hits block 1
    assert stats["hit_rate_lru"]["1"] == pytest.approx(16 / 120)


def test_mooncake_milliseconds_and_csv_with_its_block_size(tmp_path: Path) -> None:
    m = read_hash_trace(jsonl(tmp_path / "m.jsonl", [
        {"timestamp": 1500, "input_length": 1000, "output_length": 3, "hash_ids": [4, 5]}]))
    assert m.fmt == "mooncake" and m.block_size == 512 and m.arrival_s[0] == 1.5
    csv = tmp_path / "t.csv"
    csv.write_text('timestamp,input_length,output_length,hash_ids\n0.5,32,4,"1 2"\n'
                   '0.7,32,4,"[1, 3]"\n')
    c = read_hash_trace(csv, block_size=16)
    assert c.hash_ids == [(1, 2), (1, 3)]
    with pytest.raises(WorkloadError, match="block_size"):
        read_hash_trace(csv)


def test_engine_blocks_regroup_and_split_with_chained_keys() -> None:
    table: dict[tuple[int, object], int] = {}
    # engine 32 over trace 16: pairs of full trace blocks; the partial 3rd block is dropped
    a = engine_block_keys((1, 2, 3), 40, 16, 32, table)
    b = engine_block_keys((1, 2, 4, 5), 64, 16, 32, table)
    assert len(a) == 1 and len(b) == 2 and a[0] == b[0]
    # same content after a different prefix is a different block (chaining)
    c = engine_block_keys((7, 8, 4, 5), 64, 16, 32, table)
    assert c[1] != b[1]
    # engine 16 under trace 512: 1000 tokens -> 62 full engine blocks
    d = engine_block_keys((4, 5), 1000, 512, 16, table)
    assert len(d) == 62
    with pytest.raises(WorkloadError, match="multiple"):
        engine_block_keys((1,), 16, 16, 24, table)


@pytest.mark.parametrize(("text", "match"), [
    ('{"timestamp": 1, "input_length": 5, "output_length": 1}', "hash_ids"),
    ('{"timestamp": 1, "input_length": 0, "output_length": 1, "hash_ids": []}',
     "input_length"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": "x y"}',
     "hash_ids"),
    ("not json", "not JSON"),
])
def test_bad_rows_name_the_field(tmp_path: Path, text: str, match: str) -> None:
    (tmp_path / "x.jsonl").write_text(text + "\n")
    with pytest.raises(WorkloadError, match=match):
        read_hash_trace(tmp_path / "x.jsonl")


def test_trace_stats_command(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["trace", "stats", str(bailian(tmp_path)), "--cache-blocks",
                              "100"])
    assert res.exit_code == 0, res.output
    assert "infinite cache: 26.7%" in res.output and "100 blocks: 26.7%" in res.output
    bad = runner.invoke(app, ["trace", "stats", str(tmp_path / "none.jsonl")])
    assert bad.exit_code != 0 and "not found" in bad.output


def test_shipped_synthetic_trace_is_read_and_shares_prefixes() -> None:
    t = read_hash_trace("builtin:synthetic_chat_blksz_16.jsonl")
    assert len(t) == 1100 and np.all(np.diff(t.arrival_s) >= 0)
    assert 0.5 < hit_rate(t) < 0.95


def test_shipped_mooncake_slice_matches_the_published_format() -> None:
    t = read_hash_trace("builtin:mooncake_conversation_first1000.jsonl")
    assert t.fmt == "mooncake" and t.block_size == 512 and len(t) == 1000
    assert t.arrival_s[0] == 0.0 and t.arrival_s[-1] == pytest.approx(330.0)
    # every request names one block per 512 tokens, the partial last one included
    assert all(len(ids) == -(-int(n) // 512) for ids, n in zip(t.hash_ids, t.prompt_tokens,
                                                                strict=True))
    # requests share prefixes (a system prompt, earlier turns): the cache has work to do
    infinite = hit_rate(t)
    assert 0.1 < infinite < 0.5
    assert hit_rate(t, cache_blocks=2000) < infinite  # a bounded cache forgets some
