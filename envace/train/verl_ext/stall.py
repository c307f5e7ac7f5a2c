"""A training driver that stops making progress is stopped, so that its job fails and a retry resumes.

Why: verl 0.9.1's v1 sampler has no timeout (``trainer/ppo/v1/replay_buffer.py`` ``ReplayBuffer.sample``
polls until enough groups have finished). When Ray killed rollout workers on a machine short of memory,
the step never ended and the job held its node until the scheduler's time limit (docs/measurements.md,
"Where the CI's time goes; a hung training").

Implemented: :func:`run_watched` runs the driver and watches verl's file logger
(``VERL_FILE_LOGGER_PATH``: created when verl's fit loop starts, one line per logged step). When that file
has not changed for ``timeout_s`` (counted from the start until it exists, so the start-up is inside the
first window) it prints which step stalled, sends SIGTERM to the driver and every process below it (Ray's
driver shuts down the cluster it started; under Slurm the launcher script's trap stops its Ray steps),
SIGKILL to whatever is left after ``grace_s``, and returns ``EXIT_UNAVAILABLE``. The checkpoints written
before stay: Snakemake's ``retries`` resumes from the last one. ``timeout_s <= 0`` runs the driver
unwatched. The window must hold a whole step with its checkpoint save and validation
(``training.step_timeout_min``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from envace.common.exit_codes import EXIT_UNAVAILABLE

__all__ = ["last_logged_step", "run_watched"]


def last_logged_step(progress: Path) -> int | None:
    """The ``step`` of the file logger's last complete line, ``None`` when there is none."""
    try:
        lines = progress.read_bytes().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def _stop_tree(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to ``proc`` and all its descendants; SIGKILL to those alive after ``grace_s``."""
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in tree:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)
    proc.wait()


def run_watched(argv: Sequence[str], env: Mapping[str, str], progress: Path, timeout_s: float, *,
                what: str = "envace train", poll_s: float | None = None, grace_s: float = 60.0) -> int:
    """Run ``argv`` and return its exit status, or stop it and return ``EXIT_UNAVAILABLE`` once
    ``progress`` has not changed for ``timeout_s`` seconds (see the module docstring)."""
    if timeout_s <= 0:
        return subprocess.call(list(argv), env=dict(env))
    poll = poll_s if poll_s is not None else min(30.0, timeout_s / 4)
    started = time.time()
    proc = subprocess.Popen(list(argv), env=dict(env))
    try:
        while True:
            try:
                return proc.wait(timeout=poll)
            except subprocess.TimeoutExpired:
                pass
            try:
                last = max(started, progress.stat().st_mtime)
            except OSError:
                last = started
            idle = time.time() - last
            if idle > timeout_s:
                break
    except BaseException:  # Ctrl-C or an error here: the driver must not outlive this process
        _stop_tree(proc, grace_s)
        raise
    step = last_logged_step(progress)
    where = (f"after step {step}" if step is not None
             else "before its first step" if progress.exists() else "during its start-up")
    print(f"{what}: nothing logged for {idle / 60:.1f} min {where} (training.step_timeout_min "
          f"{timeout_s / 60:g}; progress file {progress}): stopping the driver so that the job fails and "
          "a retry resumes from the last checkpoint", file=sys.stderr, flush=True)
    _stop_tree(proc, grace_s)
    return EXIT_UNAVAILABLE
