"""Weight-sync sockets named per Ray cluster, so that two trainings on one host cannot cross.

verl 0.9.1 hands each step's weights from a trainer rank to its colocated vLLM worker over a ZMQ socket
``/tmp/rl-colocate-zmq-{ray job id}-replica-{r}-rank-{k}.sock``: the sender's name is built in
``ServerAdapter.__init__`` (``workers/rollout/vllm_rollout/vllm_rollout.py:141``), the receiver's in
``vLLMColocateWorkerExtension._get_zmq_handle`` (``vllm_rollout/utils.py:431``) from ``VERL_RAY_JOB_ID``,
which ``vLLMHttpServer.__init__`` sets (``vllm_async_server.py:143``) before it starts the vLLM workers.
verl put the job id there so that two verl jobs on one host do not collide, but a Ray job id is a counter
of one Ray cluster: the first driver of every cluster is ``01000000``. Two trainings with a Ray cluster
each on one host (two Slurm jobs on a shared node; the smoke DAG's concurrent trainings under a one-node
Slurm) name the same socket; the later sender deletes the earlier one's file before binding its own
(``bucketed_weight_transfer.py:170``), and both weight syncs wait forever in ``update_weights`` (seen in
the smoke DAG: two trainings stalled within the same 15 s, in ``actor_rollout_update_weights``).

Here the id both sides use is the Ray job id qualified by the Ray session (:func:`cluster_job_id`;
``RuntimeContext.get_session_name`` names one Ray cluster instance), through verl's registries:

- :class:`EnvaceServerAdapter` (the sender; ``_ROLLOUT_REGISTRY[("vllm", "async")]``) renames its socket
  after verl's ``__init__``;
- :class:`EnvaceHttpServer` (the receiver's parent) sets ``VERL_RAY_JOB_ID`` to the same id after verl's
  ``__init__``, before ``launch_server`` starts the vLLM workers that read it;
- :class:`EnvaceReplica` (``RolloutReplicaRegistry`` ``"vllm"``) serves through :class:`EnvaceHttpServer`:
  ``vLLMReplica.__init__`` fixes its ``server_class``, with no hook to choose another.

Not covered: verl's prefill/decode-disaggregated replica (``vllm_pd_replica.py:282`` sets the job id its
own way); envace does not use it. :mod:`.register` registers the classes by name, in every process:
this module (it imports vLLM's server) is imported only where verl builds a rollout.
"""

from __future__ import annotations

import hashlib
import os

import ray
from verl.workers.rollout.vllm_rollout import ServerAdapter
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

__all__ = ["EnvaceHttpServer", "EnvaceReplica", "EnvaceServerAdapter", "cluster_job_id", "qualified_job_id"]


def qualified_job_id(job_id: str, session_name: str) -> str:
    """``job_id`` with the first 8 hex digits of the SHA-256 of ``session_name`` appended (short: unix
    socket paths are limited to 107 bytes)."""
    return f"{job_id}-{hashlib.sha256(session_name.encode('utf-8')).hexdigest()[:8]}"


def cluster_job_id() -> tuple[str, str]:
    """This process's Ray job id, and that id qualified by its Ray cluster's session (the same in every
    process of one training, different between two clusters)."""
    ctx = ray.get_runtime_context()
    job_id = ctx.get_job_id()
    return job_id, qualified_job_id(job_id, ctx.get_session_name())


class EnvaceServerAdapter(ServerAdapter):
    """verl's vLLM rollout adapter whose weight-sync socket carries the qualified id of
    :func:`cluster_job_id`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        job_id, qualified = cluster_job_id()
        old, new = f"-{job_id}-replica-", f"-{qualified}-replica-"
        if old not in self.zmq_handle:
            raise RuntimeError(f"verl's weight-sync socket {self.zmq_handle!r} no longer has the form "
                               f"'...{old}...' (vllm_rollout.py:141 in verl 0.9.1); update "
                               "envace.train.verl_ext.weight_sync")
        self.zmq_handle = self.zmq_handle.replace(old, new, 1)


class EnvaceHttpServer(vLLMHttpServer):
    """verl's vLLM server actor; its vLLM workers read the qualified id of :func:`cluster_job_id` as
    ``VERL_RAY_JOB_ID``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        os.environ["VERL_RAY_JOB_ID"] = cluster_job_id()[1]


class EnvaceReplica(vLLMReplica):
    """verl's vLLM replica, serving through :class:`EnvaceHttpServer`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(EnvaceHttpServer)

