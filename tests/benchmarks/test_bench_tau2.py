"""``benchmarks/bench_tau2.py`` on one airline task: the gold replay passes and every timing is printed."""

from __future__ import annotations

import re


def test_one_task_replays_and_passes(script, capsys) -> None:
    assert script("bench_tau2").main(["--limit", "1", "--domains", "airline"]) == 0
    out = capsys.readouterr().out
    for label in ("setup", "airline: 1/1 in", "replay: 1/1 in", "total"):
        assert re.search(rf"^{label}.* \d+\.\d s wall, \d+\.\d s CPU", out, re.MULTILINE), out
