"""Fixtures for the fault-injection tests that run the smoke DAG through a real Slurm (tests/slurm).

Implemented:

- ``slurm`` (session): skips every test here unless a Slurm controller answers (``sinfo`` exits 0);
  CI starts one with ``scripts/slurm_localhost.sh start``.
- ``prebuilt`` (session): the tiny model (warm-started as the DAG's ``build_tiny_model`` rule does: the
  ``warm_tiny_model`` fixture of ``tests/conftest.py``, cached between sessions) and the CM2 training
  parquet (the ``envace data`` command of the DAG's ``prepare_training_data`` rule), copied into each
  test's sandbox. Simplification (ours): those two steps run outside Slurm, which saves two job round
  trips per test; Snakemake finds their outputs present and schedules only the job under test.
- ``workflow`` -> :class:`SlurmWorkflow`: one test's sandbox under ``tmp_path``. Its extra config file
  moves every ``paths.*`` into the sandbox and points every model path of ``config/smoke.yaml`` that
  names the smoke tiny model (models, training base models and simulators, judge, user simulators) at
  the sandbox's copy, so nothing reads or writes ``results/smoke`` or ``models/smoke``. Snakemake runs
  from the repository root with ``--profile profiles/slurm-localhost --workflow-profile none``, the
  smoke config plus the extra one, ``--slurm-logdir`` in the sandbox and a unique
  ``--slurm-jobname-prefix`` (the slurm executor names every job ``<prefix>_<run uuid>``), in the
  foreground or the background. The finalizer stops background Snakemake process groups, ``scancel``s
  every job carrying the prefix and kills every process left whose command line names the sandbox.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "config" / "smoke.yaml"
PROFILE = "profiles/slurm-localhost"
VENV_BIN = str(Path(sys.executable).parent)
PATH_KEYS = ("results", "figures", "checkpoints", "models", "data")


def env() -> dict[str, str]:
    """The environment of Snakemake and (sbatch exports it) of its jobs: the venv's ``envace`` first."""
    return {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1"}


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` merged into a copy of ``base`` (nested dicts merged, everything else replaced), as
    Snakemake merges several ``--configfile``s."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def smoke_config() -> dict[str, Any]:
    return yaml.safe_load(SMOKE.read_text())


def sandbox_overrides(root: Path) -> dict[str, Any]:
    """The extra config that moves every path of ``config/smoke.yaml`` into ``root``."""
    base = smoke_config()
    smoke_tiny = f"{base['paths']['models']}/tiny"
    tiny = str(root / "models" / "tiny")

    def moved(value: Any) -> Any:
        return tiny if value == smoke_tiny else value

    extra: dict[str, Any] = {"paths": {k: str(root / k) for k in PATH_KEYS}, "models": {},
                             "training": {"runs": {}}, "benchmarks": {}}
    for model, entry in base["models"].items():
        if "path" in entry:
            extra["models"][model] = {"path": moved(entry["path"])}
    for run, spec in base["training"]["runs"].items():
        extra["training"]["runs"][run] = {k: moved(spec[k]) for k in ("base_model", "simulator") if k in spec}
    extra["training"]["judge"] = {"model": moved(base["training"]["judge"]["model"])}
    for bench, bcfg in base["benchmarks"].items():
        helpers = {k: moved(bcfg[k]) for k in ("user_simulator", "judge") if k in bcfg}
        if helpers:
            extra["benchmarks"][bench] = helpers
    return extra


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def processes() -> dict[int, str]:
    """``pid -> command line`` of every live process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            line = _cmdline(int(entry.name))
            if line:
                out[int(entry.name)] = line
    return out


def ancestors(pid: int) -> list[int]:
    chain = []
    while pid > 1 and len(chain) < 64:
        pid = _parent(pid)
        chain.append(pid)
    return chain


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             diagnose: Callable[[], str] = lambda: "", interval: float = 0.5) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` and a diagnosis after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{diagnose()}")
        time.sleep(interval)


def tail(path: Path, n: int = 3000) -> str:
    if not path.is_file():
        return f"({path} does not exist)"
    return f"--- {path} (last {n} chars):\n{path.read_bytes()[-n:].decode(errors='replace')}"


class SlurmWorkflow:
    """One test's sandbox (see the module docstring)."""

    def __init__(self, root: Path, prebuilt: Path) -> None:
        self.root = root
        self.prefix = f"envacefi{uuid.uuid4().hex[:10]}"
        self.slurm_logdir = root / "slurm_logs"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.runs = 0
        for key in ("models", "data"):
            shutil.copytree(prebuilt / key, root / key)
        self.overrides = sandbox_overrides(root)

    # ------------------------------------------------------------------------------------ config
    def path(self, key: str) -> Path:
        return Path(self.overrides["paths"][key])

    def configure(self, extra: dict[str, Any]) -> Path:
        """Merge ``extra`` into the sandbox overrides and write the extra config file."""
        self.overrides = deep_merge(self.overrides, extra)
        out = self.root / "extra_config.yaml"
        out.write_text(yaml.safe_dump(self.overrides, sort_keys=True))
        return out

    def config(self) -> dict[str, Any]:
        """The merged config the DAG sees."""
        return deep_merge(smoke_config(), self.overrides)

    def command(self, target: str) -> list[str]:
        return [sys.executable, "-m", "snakemake", "--profile", PROFILE, "--workflow-profile", "none",
                "--configfile", str(SMOKE.relative_to(ROOT)), str(self.root / "extra_config.yaml"),
                "--slurm-logdir", str(self.slurm_logdir), "--slurm-jobname-prefix", self.prefix,
                "--", target]

    # ------------------------------------------------------------------------------------ running
    def start(self, target: str) -> tuple[subprocess.Popen[bytes], Path]:
        """Start Snakemake for ``target`` in the background; returns the process and its log file."""
        self.runs += 1
        log = self.root / f"snakemake_{self.runs}.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen(self.command(target), cwd=ROOT, env=env(), stdout=fh,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.procs.append(proc)
        return proc, log

    def wait(self, proc: subprocess.Popen[bytes], log: Path, timeout: float, what: str) -> int:
        """Wait for a background Snakemake; fails (after stopping it) when it runs past ``timeout``."""
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._stop(proc)
            pytest.fail(f"snakemake ({what}) still running after {timeout:.0f} s\n{self.diagnose(log)}")

    def run(self, target: str, timeout: float, what: str) -> tuple[int, Path]:
        proc, log = self.start(target)
        return self.wait(proc, log, timeout, what), log

    def jobs(self) -> list[dict[str, str]]:
        """This sandbox's Slurm jobs known to the controller (any state)."""
        res = subprocess.run(["squeue", "-h", "--states=all", "-o", "%i|%j|%k|%T"], capture_output=True,
                             text=True, timeout=30, check=False)
        out = []
        for line in res.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 4 and parts[1].startswith(self.prefix):
                out.append(dict(zip(("id", "name", "comment", "state"), parts, strict=True)))
        return out

    def diagnose(self, *logs: Path) -> str:
        parts = [tail(p) for p in logs]
        parts += [tail(p, 2000) for p in sorted(self.slurm_logdir.rglob("*.log"))]
        parts.append(f"slurm jobs: {self.jobs()}")
        return "\n".join(parts)

    # ------------------------------------------------------------------------------------ cleanup
    @staticmethod
    def _stop(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is not None:
            return
        for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(grace)
                return
            except subprocess.TimeoutExpired:
                continue

    def cancel_jobs(self) -> None:
        live = [j["id"] for j in self.jobs() if j["state"] in ("PENDING", "RUNNING", "CONFIGURING",
                                                                "COMPLETING", "SUSPENDED")]
        if live:
            subprocess.run(["scancel", *live], capture_output=True, timeout=30, check=False)

    def cleanup(self) -> None:
        """Cancel this sandbox's jobs, stop its Snakemake processes, cancel again (a job submitted
        meanwhile), then kill any process whose command line names the sandbox."""
        self.cancel_jobs()
        for proc in self.procs:
            self._stop(proc)
        self.cancel_jobs()
        me = os.getpid()
        for pid, line in processes().items():
            if str(self.root) in line and pid != me:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture(scope="session")
def slurm() -> None:
    if shutil.which("sinfo") is None:
        pytest.skip("no Slurm here (sinfo not found); start one with scripts/slurm_localhost.sh start")
    try:
        res = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=20, check=False)
    except subprocess.TimeoutExpired:
        pytest.skip("sinfo did not answer within 20 s")
    if res.returncode != 0:
        pytest.skip(f"no Slurm controller answers (sinfo: {res.stderr.strip()[:200]}); "
                    "start one with scripts/slurm_localhost.sh start")


@pytest.fixture(scope="session")
def prebuilt(slurm: None, tmp_path_factory: pytest.TempPathFactory, warm_tiny_model: Path) -> Path:
    """A directory with ``models/tiny`` and ``data/cm2_{train,val}.parquet`` (see the module docstring)."""
    root = tmp_path_factory.mktemp("slurm_prebuilt")
    tiny = root / "models" / "tiny"
    cfg = deep_merge(smoke_config(), sandbox_overrides(root))
    resolved = root / "config.resolved.json"
    resolved.write_text(json.dumps(cfg))
    shutil.copytree(warm_tiny_model, tiny)  # warm-started: its episodes rehearse
    data = root / "data"
    argv = ["envace", "data", "--config", str(resolved), "--out", str(data / "cm2_train.parquet"),
            "--val-out", str(data / "cm2_val.parquet"), "--summary", str(data / "cm2_summary.json")]
    res = subprocess.run(argv, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, f"{' '.join(argv)} failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return root


@pytest.fixture
def workflow(prebuilt: Path, tmp_path: Path) -> Iterator[SlurmWorkflow]:
    wf = SlurmWorkflow(tmp_path, prebuilt)
    wf.configure({})
    try:
        yield wf
    finally:
        wf.cleanup()
