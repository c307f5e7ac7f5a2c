"""``envace.train.verl_ext.stall``: a driver that logs nothing for the window is stopped with its whole
process tree (exit 3, a message naming the last logged step); one that keeps logging runs to its end."""

from __future__ import annotations

import sys
import textwrap
import time

import psutil

from envace.common.exit_codes import EXIT_UNAVAILABLE
from envace.train.verl_ext.stall import last_logged_step, run_watched


def driver(tmp_path, body: str) -> list[str]:
    """argv of a Python stand-in for verl's driver; ``progress`` is its file logger's path."""
    script = tmp_path / "driver.py"
    script.write_text("import json, os, signal, subprocess, sys, time\n"
                      f"progress = {str(tmp_path / 'metrics.jsonl')!r}\n" + textwrap.dedent(body))
    return [sys.executable, str(script)]


def log_step(step: int) -> str:
    return f"open(progress, 'a').write(json.dumps({{'step': {step}, 'data': {{}}}}) + '\\n')\n"


def test_a_driver_that_keeps_logging_runs_to_its_end(tmp_path):
    body = "".join(log_step(s) + "time.sleep(0.4)\n" for s in range(1, 6)) + "sys.exit(7)\n"
    started = time.monotonic()
    rc = run_watched(driver(tmp_path, body), {}, tmp_path / "metrics.jsonl", 1.0, poll_s=0.1)
    assert rc == 7 and time.monotonic() - started >= 2.0  # 5 steps of 0.4 s, each inside the 1-s window
    assert last_logged_step(tmp_path / "metrics.jsonl") == 5


def test_a_silent_driver_is_stopped_with_its_children(tmp_path, capsys):
    body = log_step(1) + log_step(2) + textwrap.dedent("""
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open(progress + ".child", "w").write(str(child.pid))
        time.sleep(600)
    """)
    started = time.monotonic()
    rc = run_watched(driver(tmp_path, body), {}, tmp_path / "metrics.jsonl", 1.0, poll_s=0.1, grace_s=5,
                     what="envace train [x]")
    assert rc == EXIT_UNAVAILABLE and time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert "envace train [x]: nothing logged for" in err and "after step 2" in err
    assert "training.step_timeout_min" in err and "resumes from the last checkpoint" in err
    child = int((tmp_path / "metrics.jsonl.child").read_text())
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_a_driver_that_ignores_sigterm_is_killed_after_the_grace(tmp_path, capsys):
    body = "signal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)\n"
    started = time.monotonic()
    rc = run_watched(driver(tmp_path, body), {}, tmp_path / "metrics.jsonl", 0.5, poll_s=0.1, grace_s=1)
    assert rc == EXIT_UNAVAILABLE and time.monotonic() - started < 30
    assert "during its start-up" in capsys.readouterr().err  # no progress file was ever created


def test_no_window_runs_the_driver_unwatched(tmp_path):
    body = "time.sleep(1.5)\nsys.exit(0)\n"
    assert run_watched(driver(tmp_path, body), {}, tmp_path / "metrics.jsonl", 0, poll_s=0.1) == 0


def test_the_last_logged_step_skips_a_torn_line(tmp_path):
    progress = tmp_path / "metrics.jsonl"
    assert last_logged_step(progress) is None
    progress.write_text('{"step": 3, "data": {}}\n{"step": 4, "da')
    assert last_logged_step(progress) == 3
