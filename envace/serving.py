"""Start, health-check and stop OpenAI-compatible model servers (``vllm serve`` / ``transformers serve``).

Implemented:
- :func:`server_command`: the command line for ``vllm serve`` (GPU; ``--served-model-name``,
  ``--tensor-parallel-size``, ``--seed``, ``--max-model-len``, ``--gpu-memory-utilization``) or
  ``transformers serve`` (CPU: the model is preloaded as ``FORCE_MODEL``, ``--device cpu``; with
  ``model_path=""`` no model is pinned and the server loads whichever model a request names, so one
  process can serve several models — :class:`ServedModel`).
- :func:`free_port`: a port the OS reports free on ``host``. Several jobs on one node may race for it,
  so :class:`Server` retries with a new port (up to ``attempts``) when the process exits before it is
  healthy.
- :class:`Server`: starts the command in its own process group (``start_new_session``), logs to a file,
  polls ``GET /health`` until it answers 200 (``ready_timeout`` seconds; a process that exits meanwhile
  fails at once with the tail of its log), exposes ``base_url`` (``http://host:port/v1``) and
  ``poll()`` (exit code or ``None``: used by the HTTP backends to tell "server died" from other
  errors) and ``exit_code(wait)`` (the same, waiting a little for a dying process), and stops the
  whole group (SIGTERM, then SIGKILL after ``stop_timeout``) on ``stop()``, context exit, interpreter
  exit (``atexit``) or — via :func:`install_signal_handlers` — SIGTERM/SIGINT. ``launch()`` +
  ``wait_ready()`` split the start so a caller can overlap its own start-up with the server's.

Verified here: the vLLM command line is composed and checked in tests (no GPU); ``transformers serve``
with the tiny model is started for real in a test (see tests/eval/test_serving.py).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any, Literal

__all__ = ["Server", "ServerError", "server_command", "free_port", "install_signal_handlers"]

Kind = Literal["vllm", "transformers"]


class ServerError(RuntimeError):
    """A server could not be started or became unhealthy."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _executable(name: str) -> str:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def server_command(
    kind: Kind,
    model_path: str,
    *,
    host: str,
    port: int,
    served_name: str | None = None,
    gpus: int = 1,
    seed: int = 0,
    max_model_len: int | None = None,
    gpu_memory_utilization: float | None = None,
    device: str = "cpu",
) -> list[str]:
    """The argv that serves ``model_path`` on ``host:port``."""
    if kind == "vllm":
        cmd = [_executable("vllm"), "serve", model_path, "--host", host, "--port", str(port),
               "--served-model-name", served_name or model_path, "--tensor-parallel-size", str(gpus),
               "--seed", str(seed)]
        if max_model_len:
            cmd += ["--max-model-len", str(max_model_len)]
        if gpu_memory_utilization:
            cmd += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
        return cmd
    if kind == "transformers":
        if not model_path:  # multi-model: loads what each request names; keep models for a whole job
            return [_executable("transformers"), "serve", "--host", host, "--port", str(port),
                    "--device", device, "--model-timeout", "86400"]
        return [_executable("transformers"), "serve", model_path, "--host", host, "--port", str(port),
                "--device", device]
    raise ValueError(f"unknown server kind {kind!r} (vllm or transformers)")


class Server:
    """One model server process group (see the module docstring).

    Args:
        kind: ``vllm`` or ``transformers``.
        model_path: local directory or HF id.
        port: 0 = pick a free port.
        log_path: server stdout/stderr (default: a temp file).
        command: override the argv (``{port}`` in it is replaced by the chosen port); for tests.
        health_path: health endpoint (``/health`` for both servers).
    """

    def __init__(self, kind: Kind, model_path: str, *, host: str = "127.0.0.1", port: int = 0,
                 served_name: str | None = None, ready_timeout: float = 600.0, stop_timeout: float = 15.0,
                 log_path: str | Path | None = None, attempts: int = 3, command: list[str] | None = None,
                 health_path: str = "/health", env: dict[str, str] | None = None, **cmd_kwargs: Any) -> None:
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
        self.env = env
        self.cmd_kwargs = cmd_kwargs
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._launches = 0

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def argv(self, port: int) -> list[str]:
        if self.command is not None:
            return [part.replace("{port}", str(port)) for part in self.command]
        return server_command(self.kind, self.model_path, host=self.host, port=port,
                              served_name=self.served_name, **self.cmd_kwargs)

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
        """Start the process on a fresh port without waiting (see :meth:`wait_ready`): a caller can do
        other start-up work (imports, loading tasks) while the server boots."""
        self.port = self.requested_port or free_port(self.host)
        if self.log_path is None:
            import tempfile

            fd, name = tempfile.mkstemp(prefix="envace-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        env = {**os.environ, **(self.env or {})}
        self.proc = subprocess.Popen(self.argv(self.port), stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        self._launches += 1
        atexit.register(self.stop)
        return self

    def wait_ready(self) -> Server:
        """Wait until the launched server is healthy; a process that exits first (e.g. another job took
        the port) is relaunched on a new port, up to ``attempts`` launches. Raises :class:`ServerError`."""
        while True:
            try:
                self._wait_healthy()
                return self
            except ServerError as exc:
                exited = self.poll() is not None
                self.stop()
                if not exited or self.requested_port or self._launches >= max(1, self.attempts):
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
                raise ServerError(f"{self.kind} server exited with code {code} before it was healthy; "
                                  f"log {self.log_path}:\n{self._log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        raise ServerError(f"{self.kind} server not healthy at {url} after {self.ready_timeout:.0f} s; "
                          f"log {self.log_path}:\n{self._log_tail()}")

    def stop(self) -> None:
        """Stop the whole process group (idempotent)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        elif proc is not None:
            # the leader exited; children of its group may remain
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServedModel:
    """One model of a running multi-model server (``transformers serve`` started with no pinned model):
    requests name it by ``served_name`` (its path); ``base_url`` and ``poll()`` are the server's."""

    def __init__(self, server: Server, served_name: str) -> None:
        self.server = server
        self.served_name = served_name

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def poll(self) -> int | None:
        return self.server.poll()


def install_signal_handlers() -> None:
    """Turn SIGTERM (and SIGHUP) into ``SystemExit`` so ``finally``/context exits stop servers."""

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
