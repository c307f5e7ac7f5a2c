"""Weight-sync sockets named per Ray cluster (envace.train.verl_ext.weight_sync), through verl's own sender
(``ServerAdapter``) and receiver (``vLLMColocateWorkerExtension._get_zmq_handle`` reading the environment
``vLLMHttpServer`` sets), each Ray cluster stood in for by its runtime context (job id, session name)."""

from __future__ import annotations

import os
import types
from pathlib import Path

import pytest


class _Context:
    """A Ray runtime context: every cluster's first driver has job id 01000000."""

    def __init__(self, session: str) -> None:
        self.session = session

    def get_job_id(self) -> str:
        return "01000000"

    def get_session_name(self) -> str:
        return self.session


@pytest.fixture(scope="module")
def verl_configs(tmp_path_factory: pytest.TempPathFactory):
    import envace.train.verl_ext.cpu.platform  # noqa: F401  (as in every verl process, before verl)
    import envace.train.verl_ext.register  # noqa: F401
    from envace.serve.tiny_model import build_tiny_model

    model = build_tiny_model(Path(tmp_path_factory.mktemp("weight_sync")) / "tiny")
    from verl.workers.config import HFModelConfig, RolloutConfig

    rollout = RolloutConfig(name="vllm", mode="async", tensor_model_parallel_size=1, data_parallel_size=1,
                            pipeline_model_parallel_size=1)
    return rollout, HFModelConfig(path=str(model))


def _sockets(monkeypatch: pytest.MonkeyPatch, configs, session: str, sender: type) -> tuple[str, str]:
    """(sender's socket, receiver's socket) of replica 0, rank 0 in the Ray cluster ``session``."""
    import ray
    from verl.workers.rollout.replica import RolloutMode
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

    from envace.train.verl_ext.weight_sync import EnvaceHttpServer

    rollout, model = configs
    monkeypatch.setattr(ray, "get_runtime_context", lambda: _Context(session))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("RAY_LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("VERL_RAY_JOB_ID", "unset")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    adapter = sender(config=rollout, model_config=model, device_mesh=None)
    EnvaceHttpServer(config=rollout, model_config=model, rollout_mode=RolloutMode.HYBRID, workers=[],
                     replica_rank=0, node_rank=0, gpus_per_node=1, nnodes=1, cuda_visible_devices="")
    worker = types.SimpleNamespace(local_rank=0, model_runner=None)  # a vLLM worker of that server
    return adapter.zmq_handle, vLLMColocateWorkerExtension._get_zmq_handle(worker)


def test_two_clusters_on_one_host_get_two_sockets_and_each_sender_meets_its_receiver(monkeypatch,
                                                                                     verl_configs):
    from verl.workers.rollout.vllm_rollout import ServerAdapter

    from envace.train.verl_ext.weight_sync import EnvaceServerAdapter

    # verl's own naming: the two clusters' senders bind one path (the stall)
    verl_a, _ = _sockets(monkeypatch, verl_configs, "session_a", ServerAdapter)
    verl_b, _ = _sockets(monkeypatch, verl_configs, "session_b", ServerAdapter)
    assert verl_a == verl_b
    send_a, recv_a = _sockets(monkeypatch, verl_configs, "session_a", EnvaceServerAdapter)
    send_b, recv_b = _sockets(monkeypatch, verl_configs, "session_b", EnvaceServerAdapter)
    assert send_a == recv_a and send_b == recv_b
    assert send_a != send_b
    assert send_a.startswith("ipc:///tmp/rl-colocate-zmq-01000000-")
    assert send_a.endswith("-replica-0-rank-0.sock")
    assert len(send_a) - len("ipc://") < 107  # a unix socket path's limit
    assert os.environ.get("VERL_RAY_JOB_ID") != "unset"


def test_verl_builds_envace_classes_for_vllm(verl_configs):
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    from envace.train.verl_ext.weight_sync import EnvaceHttpServer, EnvaceReplica, EnvaceServerAdapter

    rollout, model = verl_configs
    assert get_rollout_class("vllm", "async") is EnvaceServerAdapter
    assert get_rollout_replica_class("vllm") is EnvaceReplica
    replica = EnvaceReplica(replica_rank=0, config=rollout, model_config=model, gpus_per_node=1)
    assert replica.server_class.__ray_actor_class__ is EnvaceHttpServer


def test_qualified_job_id():
    from envace.train.verl_ext.weight_sync import qualified_job_id

    assert qualified_job_id("01000000", "s1") == qualified_job_id("01000000", "s1")
    assert qualified_job_id("01000000", "s1") != qualified_job_id("01000000", "s2")
    assert qualified_job_id("02000000", "s1").startswith("02000000-")
