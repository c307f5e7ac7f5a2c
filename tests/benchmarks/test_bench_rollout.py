"""``benchmarks/bench_rollout.py`` at a few trajectories: our loop and verl's ``ToolAgentLoop`` run on the
same scripted replies, build the same ACT context, and ours encodes only the new tokens of each turn."""

from __future__ import annotations

import asyncio
import math
import re


def test_quick_run_matches_verl(script, capsys) -> None:
    script("bench_rollout").main(["--trajectories", "2", "--turns", "3"])
    out = capsys.readouterr().out
    assert re.search(r"same ACT token ids \(\d+ tokens, verl's context a prefix of ours\): True", out), out
    harness = [float(x) for x in re.findall(r"(\d+\.\d+) ms", out)]
    assert len(harness) == 4 and all(math.isfinite(x) and x >= 0 for x in harness), out


def test_one_turn_is_a_clear_usage_error(script, capsys) -> None:
    import pytest

    with pytest.raises(SystemExit) as exc:
        script("bench_rollout").main(["--trajectories", "2", "--turns", "1"])
    assert exc.value.code == 2 and "--turns must be >= 2" in capsys.readouterr().err


def test_encoded_tokens_per_turn_stay_flat_as_contexts_grow(script) -> None:
    r = asyncio.run(script("bench_rollout").bench(1, 11))  # 11 turns: early and late windows of 5 apart
    assert r["k"] == 5 and all(math.isfinite(v) for v in r.values())
    for ctx in ("act", "reh"):
        assert r[f"{ctx}_encoded_early"] == r[f"{ctx}_encoded_late"] > 0, r
        assert r[f"{ctx}_context_late"] > r[f"{ctx}_context_early"] > 0, r
