"""The per-role trainer on CPU: real verl trainer object (composed per_role_8b config), stand-in worker
groups, replay buffer and TransferQueue reads. Checks the step's routing of rows to policies, the single
role-wise advantage pass, padding clean-up, weight sync of both policies, and checkpoint save / resume."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest
import transfer_queue
from omegaconf import OmegaConf
from transfer_queue import KVBatchMeta

from envace.config import load_config
from envace.verl_ext.compose import compose, run_overrides
from envace.verl_ext.per_role import REHEARSE_POOL
from envace.verl_ext.per_role_trainer import PairedWeightSync, PerRoleTrainer, prefix_metrics

CFG = load_config("config/config.yaml")
ROLES = ["act", "rehearse", "act", "rehearse", "act", None, "act"]


class FakeWorkerGroup:
    """Records checkpoint calls; ``save_checkpoint`` writes a marker like verl's checkpoint manager."""

    def __init__(self, name: str, on_save: Any = None) -> None:
        self.name = name
        self.saved: list[tuple[str, int]] = []
        self.loaded: list[str] = []
        self.on_save = on_save

    def save_checkpoint(self, local_path, remote_path, global_step, max_ckpt_to_keep=None):
        if self.on_save:
            self.on_save(local_path)
        os.makedirs(local_path, exist_ok=True)
        with open(os.path.join(local_path, "policy.txt"), "w") as fh:
            fh.write(self.name)
        self.saved.append((local_path, global_step))

    def load_checkpoint(self, local_path, del_local_after_load=False):
        self.loaded.append(local_path)


class FakeSync:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def update_weights(self, global_steps=None):
        self.calls.append(f"update:{global_steps}")
        return {}

    def sleep_replicas(self):
        self.calls.append("sleep")


class Recording(PerRoleTrainer):
    """verl's per-actor primitives replaced by recorders (they need Ray workers and TransferQueue)."""

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        self.log.append(("balance", self.actor_rollout_wg.name, tuple(batch.keys)))
        metrics["global_seqlen/mean"] = float(len(batch))
        pad = KVBatchMeta(keys=[f"pad{self.actor_rollout_wg.name}_0_0"], tags=[{"is_padding": True}],
                          partition_id=batch.partition_id)
        return KVBatchMeta.concat([batch, pad])  # verl pads each part for its own data-parallel size

    def _compute_old_log_prob(self, batch, metrics):
        self.log.append(("old_log_prob", self.actor_rollout_wg.name, tuple(batch.keys)))
        metrics["actor/entropy"] = 1.0 if self.actor_rollout_wg.name == "act" else 2.0
        return batch

    def _compute_ref_log_prob(self, batch, metrics):
        self.log.append(("ref", self.ref_policy_wg.name, tuple(batch.keys)))
        return batch

    def _compute_advantage(self, batch, metrics):
        self.log.append(("adv", None, tuple(batch.keys)))
        return batch

    def _update_actor(self, batch, metrics):
        self.log.append(("update", self.actor_rollout_wg.name, tuple(batch.keys)))
        metrics["actor/pg_loss"] = 0.1 if self.actor_rollout_wg.name == "act" else 0.2
        return batch


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    ck = tmp_path_factory.mktemp("ck") / "per_role_8b"
    c = compose("per_role_8b", run_overrides(CFG, "per_role_8b", str(ck), "/d/t.parquet"))
    OmegaConf.resolve(c)
    return c


@pytest.fixture
def trainer(config, monkeypatch, tmp_path):
    c = OmegaConf.create(OmegaConf.to_container(config))
    c.trainer.default_local_dir = str(tmp_path / "ck")
    t = Recording(c)
    t.built_buffer = type(t.replay_buffer).__name__
    t.log = []
    t.actor_rollout_wg, t.rehearse_wg = FakeWorkerGroup("act"), FakeWorkerGroup("rehearse")
    t.ref_policy_wg = t.actor_rollout_wg  # verl's hybrid layout: the reference lives in the actor group
    t.act_sync, t.rehearse_sync = FakeSync(), FakeSync()
    t.checkpoint_manager = PairedWeightSync([t.act_sync, t.rehearse_sync])
    t.reward_loop_manager = SimpleNamespace(reward_loop_worker_handles=["streaming"])
    t.curr_step_profile, t.timing_raw = False, {}
    t.global_steps = 3
    keys = [f"u{i // 2}_0_{i}" for i in range(len(ROLES))]
    tags = [{"is_padding": r is None} for r in ROLES]
    t.extra = {k: {"envace_role": r or "act"} for k, r in zip(keys, ROLES, strict=True)}  # pads copy a row
    t.replay_buffer = SimpleNamespace(
        sample=lambda **kw: (KVBatchMeta(keys=keys, tags=tags, partition_id="train"), {"sampler/x": 1})
    )
    cleared: list[list[str]] = []

    def kv_batch_get(keys, partition_id, select_fields):
        assert select_fields == ["extra_fields"]
        return {"extra_fields": [t.extra[k] for k in keys]}

    monkeypatch.setattr(transfer_queue, "kv_batch_get", kv_batch_get)
    monkeypatch.setattr(transfer_queue, "kv_clear", lambda keys, partition_id: cleared.append(list(keys)))
    t.cleared = cleared
    return t


def test_constructed_from_composed_config(trainer):
    assert trainer.trainer_mode == "sync" and trainer.built_buffer == "ReplayBuffer"  # not the async one
    assert trainer.config.trainer.v1.trainer_mode == "envace_per_role_sync"
    assert trainer.rehearse_wg is not None and trainer.config.envace.per_role.rehearse_nnodes == 1


def test_resource_pools_reserve_both_policies(trainer):
    trainer._init_resource_pool_mgr()
    spec = trainer.resource_pool_manager.resource_pool_spec
    assert spec["global_pool"] == [8] and spec[REHEARSE_POOL] == [8]
    assert trainer.resource_pool_manager.get_n_gpus() == 16 == 2 * 8  # = config.yaml's nodes x gpus


def test_step_routes_rows_to_their_policy(trainer):
    metrics: dict = {}
    out = trainer._step_once(metrics, {}, 16)
    log = trainer.log
    act_keys = tuple(k for k, r in zip(trainer.extra, ROLES, strict=True) if r == "act")
    reh_keys = tuple(k for k, r in zip(trainer.extra, ROLES, strict=True) if r == "rehearse")
    pad_key = next(k for k, r in zip(trainer.extra, ROLES, strict=True) if r is None)
    assert ("balance", "act", act_keys) in log and ("balance", "rehearse", reh_keys) in log
    assert ("old_log_prob", "act", (*act_keys, "padact_0_0")) in log
    assert ("old_log_prob", "rehearse", (*reh_keys, "padrehearse_0_0")) in log
    assert ("update", "act", (*act_keys, "padact_0_0")) in log
    assert ("update", "rehearse", (*reh_keys, "padrehearse_0_0")) in log
    advs = [e for e in log if e[0] == "adv"]
    assert advs == [("adv", None, (*act_keys, "padact_0_0", *reh_keys, "padrehearse_0_0"))]  # once, union
    order = [e[0] for e in log]
    assert order.index("adv") > max(i for i, e in enumerate(order) if e == "old_log_prob")
    assert order.index("adv") < min(i for i, e in enumerate(order) if e == "update")
    assert trainer.cleared == [[pad_key]]  # the sampled padding row is dropped and cleared
    assert out.keys == [*act_keys, "padact_0_0", *reh_keys, "padrehearse_0_0"]
    assert trainer.actor_rollout_wg.name == "act"  # restored after the REHEARSE blocks
    assert metrics["actor/entropy"] == 1.0 and metrics["rehearse_actor/entropy"] == 2.0
    assert metrics["actor/pg_loss"] == 0.1 and metrics["rehearse_actor/pg_loss"] == 0.2
    assert metrics["envace/rows/act"] == 4 and metrics["envace/rows/rehearse"] == 2
    assert trainer.act_sync.calls == ["sleep"] == trainer.rehearse_sync.calls  # both sleep after sampling


def test_step_with_kl_uses_each_policy_reference(trainer):
    trainer.use_reference_policy = True
    trainer._step_once({}, {}, 16)
    refs = {e[1] for e in trainer.log if e[0] == "ref"}
    assert refs == {"act", "rehearse"} and trainer.ref_policy_wg.name == "act"


def test_step_without_rehearse_rows_updates_only_act(trainer):
    for k in trainer.extra:
        trainer.extra[k] = {"envace_role": "act"}
    trainer._step_once({}, {}, 16)
    assert {e[1] for e in trainer.log if e[0] == "update"} == {"act"}


def test_weight_sync_hooks_reach_both_policies(trainer):
    trainer.on_init_end()
    trainer.on_step_end()
    assert trainer.act_sync.calls == ["update:3", "update:3"] == trainer.rehearse_sync.calls


def test_checkpoint_layout_save_order_and_resume(trainer, tmp_path):
    ck = tmp_path / "ck"
    tracker = ck / "latest_checkpointed_iteration.txt"

    def tracker_not_yet_written(path):
        assert not tracker.exists() or tracker.read_text() != "3", "REHEARSE must be saved before the tracker"

    trainer.rehearse_wg.on_save = tracker_not_yet_written
    trainer.train_dataloader = SimpleNamespace(state_dict=lambda: {"pos": 3})
    trainer._save_checkpoint()
    step = ck / "global_step_3"
    assert (step / "actor" / "policy.txt").read_text() == "act"
    assert (step / "rehearse_actor" / "policy.txt").read_text() == "rehearse"
    assert (step / "data.pt").is_file() and tracker.read_text() == "3"

    restored: list[dict] = []
    trainer.train_dataloader = SimpleNamespace(load_state_dict=restored.append)
    trainer.actor_rollout_wg, trainer.rehearse_wg = FakeWorkerGroup("act"), FakeWorkerGroup("rehearse")
    trainer._load_checkpoint()
    assert trainer.global_steps == 3 and restored == [{"pos": 3}]
    assert trainer.actor_rollout_wg.loaded == [str(step / "actor")]
    assert trainer.rehearse_wg.loaded == [str(step / "rehearse_actor")]

    for f in (step / "rehearse_actor").iterdir():
        f.unlink()
    (step / "rehearse_actor").rmdir()
    with pytest.raises(FileNotFoundError, match="REHEARSE policy"):
        trainer._load_checkpoint()


def test_fresh_start_loads_nothing(trainer):
    trainer._load_checkpoint()
    assert trainer.global_steps == 0
    assert not trainer.rehearse_wg.loaded and not trainer.actor_rollout_wg.loaded


def test_prefix_metrics():
    m = {"actor/pg_loss": 1, "perf/mfu/actor": 2, "global_seqlen/mean": 3}
    assert prefix_metrics(m, "act") == m
    assert prefix_metrics(m, "rehearse") == {
        "rehearse_actor/pg_loss": 1, "perf/mfu/rehearse_actor": 2, "rehearse/global_seqlen/mean": 3
    }
