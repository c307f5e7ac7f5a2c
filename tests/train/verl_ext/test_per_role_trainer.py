"""The per-role trainer on CPU: real verl trainer object (composed per_role_8b config), stand-in worker
groups, replay buffer and TransferQueue reads. Checks the step's routing of rows to policies, the single
role-wise advantage pass, padding clean-up, weight sync of both policies, and checkpoint save / resume."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace
from typing import Any

import pytest
import transfer_queue
from omegaconf import OmegaConf
from transfer_queue import KVBatchMeta
from verl.workers.rollout.replica import RolloutReplica

from envace.common.config import load_config
from envace.train.verl_ext.compose import compose, run_overrides
from envace.train.verl_ext.per_role import REHEARSE_POOL
from envace.train.verl_ext.per_role_trainer import (
    REPLICA_OFFSET_ENV,
    SKIP_REHEARSE_SYNC_ENV,
    OwnServerActorRolloutRefWorker,
    PairedWeightSync,
    PerRoleTrainer,
    PolicyServerManager,
    prefix_metrics,
    split_union,
)
from envace.train.verl_ext.trainer import RolloutAgreementError, check_rollout_agreement, prob_diffs

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


def test_checkpoint_waits_for_the_steps_metrics(trainer, tmp_path):
    """verl's fit loop asks for step N's checkpoint before it logs step N's metrics; a job killed in
    between would resume at N+1 without them. The save is written once the tracker has logged step N."""
    logged: list[int] = []

    def log(data, step):
        assert not (tmp_path / "ck" / "global_step_3").exists(), "checkpoint written before the metrics"
        logged.append(step)

    trainer.train_dataloader = SimpleNamespace(state_dict=lambda: {"pos": 3})
    trainer.logger = SimpleNamespace(log=log, finish=lambda: "verl's other tracker methods pass through")
    trainer._save_checkpoint()  # what verl's fit loop calls after step 3's update
    assert not (tmp_path / "ck" / "global_step_3").exists()
    trainer.logger.log({"actor/loss": 0.1}, step=2)  # another step's line: no save
    assert not (tmp_path / "ck" / "global_step_3").exists()
    trainer.logger.log(data={"actor/loss": 0.1}, step=3)
    assert logged == [2, 3]
    assert (tmp_path / "ck" / "global_step_3" / "rehearse_actor" / "policy.txt").is_file()
    assert (tmp_path / "ck" / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert trainer.logger.finish() == "verl's other tracker methods pass through"


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


# ---------------------------------------------------------------- the second policy's own servers and sync


def test_role_batches_are_cut_after_the_advantage_step(trainer):
    """verl's advantage step returns a new meta listing the fields it wrote; each update must get those."""

    def advantage(batch, metrics):
        trainer.log.append(("adv", None, tuple(batch.keys)))
        return KVBatchMeta(keys=list(batch.keys), tags=list(batch.tags), partition_id=batch.partition_id,
                           fields=["advantages", "returns"])

    seen: dict[str, Any] = {}

    def update(batch, metrics):
        seen[trainer.actor_rollout_wg.name] = (tuple(batch.keys), batch.fields)
        return batch

    trainer._compute_advantage, trainer._update_actor = advantage, update
    trainer._step_once({}, {}, 16)
    assert seen["act"][1] == ["advantages", "returns"] == seen["rehearse"][1]
    act_keys = tuple(k for k, r in zip(trainer.extra, ROLES, strict=True) if r == "act")
    assert seen["act"][0] == (*act_keys, "padact_0_0")


def test_split_union_checks_counts():
    union = KVBatchMeta(keys=["a", "b", "c"], tags=[{}, {}, {}], partition_id="train")
    parts = split_union(union, {"act": 2, "rehearse": 1})
    assert parts["act"].keys == ["a", "b"] and parts["rehearse"].keys == ["c"]
    with pytest.raises(ValueError, match="3 rows"):
        split_union(union, {"act": 1})


@pytest.mark.parametrize(("mode", "expected"), [(None, 3), ("after_first", 1), ("all", 0)])
def test_paired_sync_test_switch(mode, expected):
    act, reh = FakeSync(), FakeSync()
    sync = PairedWeightSync([act, reh], skip={1: mode} if mode else None)
    for step in range(3):
        sync.update_weights(step)
    assert len(act.calls) == 3 and len(reh.calls) == expected


def test_rehearse_sync_switch_is_read_from_the_environment(trainer, monkeypatch):
    monkeypatch.setenv(SKIP_REHEARSE_SYNC_ENV, "sometimes")
    with pytest.raises(ValueError, match=SKIP_REHEARSE_SYNC_ENV):
        trainer._setup_rehearse_policy()


class _FakeReplica(RolloutReplica):
    """verl's RolloutReplica with its real init_hybrid; launch_servers only records the workers it got."""

    async def launch_servers(self):
        assert len(self.workers) == self.world_size, "verl's assertion in vLLMReplica.launch_servers"
        self._server_handle, self._server_address = f"server{self.replica_rank}", f"addr{self.replica_rank}"


class _FakeServerManager(PolicyServerManager):
    rollout_replica_class = _FakeReplica


def _with_tp(config, tp):
    c = OmegaConf.create(OmegaConf.to_container(config))
    c.actor_rollout_ref.rollout.tensor_model_parallel_size = tp
    return c


@pytest.mark.parametrize(("act_replicas", "own_workers", "tp"), [(1, 1, 1), (2, 2, 1), (3, 1, 1), (1, 4, 2)])
def test_second_policy_replicas_take_their_own_workers(config, act_replicas, own_workers, tp):
    group = SimpleNamespace(workers=[f"reh_w{i}" for i in range(own_workers)], world_size=own_workers)
    manager = _FakeServerManager(config=_with_tp(config, tp), worker_group=group, start_rank=act_replicas)
    asyncio.run(manager._initialize_llm_servers())
    replicas = manager.rollout_replicas
    n = own_workers // tp
    assert [r.replica_rank for r in replicas] == list(range(act_replicas, act_replicas + n))
    # each replica gets its own slice of this group (not past its end)
    assert [r.workers for r in replicas] == [group.workers[i * tp:(i + 1) * tp] for i in range(n)]
    assert manager.worker_group is group  # the view is only lent to verl's init_hybrid


def test_first_policy_manager_is_verls(config):
    group = SimpleNamespace(workers=["w0", "w1"], world_size=2)
    manager = _FakeServerManager(config=_with_tp(config, 1), worker_group=group)
    asyncio.run(manager._initialize_llm_servers())
    assert [r.workers for r in manager.rollout_replicas] == [["w0"], ["w1"]]


class _FakeAdapter:
    def __init__(self, config, model_config, device_mesh, replica_rank=-1):
        self.config, self.model_config, self.device_mesh = config, model_config, device_mesh
        self.replica_rank = 0 if replica_rank == -1 else replica_rank  # verl: RANK // rollout world size


@pytest.mark.parametrize(("offset", "expected"), [("", 0), ("0", 0), ("2", 2)])
def test_worker_adapter_addresses_its_policys_replica(monkeypatch, offset, expected):
    from verl.workers.engine_workers import ActorRolloutRefWorker

    def verl_init_model(self):
        self.rollout = _FakeAdapter("cfg", "model", "mesh")

    monkeypatch.setattr(ActorRolloutRefWorker, "init_model", verl_init_model)
    monkeypatch.setenv(REPLICA_OFFSET_ENV, offset)
    worker = object.__new__(OwnServerActorRolloutRefWorker)
    OwnServerActorRolloutRefWorker.init_model(worker)
    assert worker.rollout.replica_rank == expected
    assert (worker.rollout.config, worker.rollout.model_config, worker.rollout.device_mesh) == (
        "cfg", "model", "mesh")


def test_verl_adapter_takes_a_replica_rank():
    """The coupling: verl's vLLM ServerAdapter accepts the replica rank the worker subclass passes."""
    import inspect

    from verl.workers.rollout.vllm_rollout import ServerAdapter

    assert "replica_rank" in inspect.signature(ServerAdapter.__init__).parameters


# ---------------------------------------------------------------- the agreement guard


def test_agreement_guard_per_role(trainer):
    keys = trainer._rollout_agreement_metrics()
    ok = {keys["act"]: 0.9999, keys["rehearse"]: 0.9997}
    assert check_rollout_agreement(ok, keys, 0.8, 1) == {"act": 0.9999, "rehearse": 0.9997}
    with pytest.raises(RolloutAgreementError, match=r"rehearse: rehearse/training/rollout_actor_probs"):
        check_rollout_agreement({**ok, keys["rehearse"]: 0.002}, keys, 0.8, 2)
    with pytest.raises(RolloutAgreementError):
        check_rollout_agreement({**ok, keys["act"]: float("nan")}, keys, 0.8, 2)
    # an undefined correlation (constant probabilities: a collapsed policy) is decided by the probabilities
    diff = {k: keys[k].replace("rollout_actor_probs_pearson_corr", "rollout_probs_diff_mean") for k in keys}
    collapsed = {**ok, keys["act"]: float("nan"), diff["act"]: 0.001}
    assert check_rollout_agreement(collapsed, keys, 0.8, 3)["rehearse"] == 0.9997
    assert prob_diffs(collapsed, keys) == {"act": 0.001}
    with pytest.raises(RolloutAgreementError, match=r"act: .* undefined .* = 0.3 > "):
        check_rollout_agreement({**collapsed, diff["act"]: 0.3}, keys, 0.8, 3)
    with pytest.raises(RolloutAgreementError, match="undefined"):
        check_rollout_agreement({**collapsed, diff["act"]: float("nan")}, keys, 0.8, 3)
    assert check_rollout_agreement({**collapsed, diff["act"]: 0.3}, keys, 0.8, 3, max_prob_diff=0.5)
    # a role without rows this step, or without response tokens, is not measured
    assert check_rollout_agreement({keys["act"]: 0.99}, keys, 0.8, 1) == {"act": 0.99}
    no_tokens = {**ok, keys["rehearse"]: float("nan"), "rehearse/training/rollout_probs_diff_valid": 0}
    assert set(check_rollout_agreement(no_tokens, keys, 0.8, 1)) == {"act"}


def test_agreement_floor_from_config(trainer, config):
    assert trainer.min_agreement == config.envace.min_rollout_actor_corr == 0.8
    c = OmegaConf.create(OmegaConf.to_container(config))
    c.actor_rollout_ref.rollout.calculate_log_probs = False
    with pytest.raises(ValueError, match="calculate_log_probs"):
        PerRoleTrainer(c)


def test_shared_trainer_agreement_per_role(monkeypatch):
    """The shared-policy trainer measures each role's rows too, with verl's calculate_debug_metrics."""
    import torch
    from tensordict import TensorDict

    from envace.train.verl_ext.trainer import EnvaceTrainer

    c = compose("envace_8b", run_overrides(CFG, "envace_8b", "/tmp/unused_ck", "/d/t.parquet"))
    OmegaConf.resolve(c)
    t = EnvaceTrainer(c)
    gen = torch.Generator().manual_seed(0)
    rows = {}
    for i, role in enumerate(["act", "act", "rehearse", "rehearse"]):
        actor = torch.rand(6, generator=gen).log()
        rollout = actor + 1e-4 if role == "act" else torch.rand(6, generator=gen).log()  # REHEARSE unsynced
        rows[f"k{i}"] = (role, actor, rollout)
    batch = KVBatchMeta(keys=[*rows, "pad"], tags=[{}] * 4 + [{"is_padding": True}], partition_id="train")

    def kv_batch_get(keys, partition_id, select_fields):
        if select_fields == ["extra_fields"]:
            return {"extra_fields": [{"envace_role": rows[k][0] if k in rows else "act"} for k in keys]}
        assert "pad" not in keys
        td = TensorDict({"old_log_probs": torch.stack([rows[k][1] for k in keys]),
                         "rollout_log_probs": torch.stack([rows[k][2] for k in keys]),
                         "response_mask": torch.ones(len(keys), 6, dtype=torch.long),
                         "responses": torch.zeros(len(keys), 6, dtype=torch.long)}, batch_size=len(keys))
        return SimpleNamespace(to_padded_tensor=lambda: td)

    monkeypatch.setattr(transfer_queue, "kv_batch_get", kv_batch_get)
    m = t._role_agreement(batch)
    assert m["envace/act/training/rollout_actor_probs_pearson_corr"] > 0.999
    assert m["envace/rehearse/training/rollout_actor_probs_pearson_corr"] < 0.8
    with pytest.raises(RolloutAgreementError, match="shared/rehearse"):
        check_rollout_agreement({**m, "training/rollout_actor_probs_pearson_corr": 0.95},
                                t._rollout_agreement_metrics(), t.min_agreement, 1)


def test_group_filter_refills_are_bounded(trainer, monkeypatch):
    """verl's group filtering draws replacement prompts through the trainer; the draw that reaches
    envace.max_filter_refill_batches batches in one step turns the buffer's filtering off for the rest of
    that step (its groups are kept whatever their rewards), and the next step filters again."""
    from types import SimpleNamespace

    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    assert trainer.max_refill == 2 * trainer.config.data.train_batch_size  # the default bound
    drawn: list[int] = []
    monkeypatch.setattr(PPOTrainerSync, "_add_prompts_to_generate", lambda self, n: drawn.append(n) or n)
    buffer = SimpleNamespace(filter_groups_metric="reward")
    monkeypatch.setattr(trainer, "replay_buffer", buffer, raising=False)
    monkeypatch.setattr(trainer, "_filter_metric", "reward", raising=False)
    trainer.max_refill, trainer._refilled = 20, 0
    assert trainer._add_prompts_to_generate(12) == 12 and buffer.filter_groups_metric == "reward"
    assert trainer._add_prompts_to_generate(8) == 8 and buffer.filter_groups_metric is None  # 20: the bound
    assert trainer._add_prompts_to_generate(3) == 3  # in-flight credit still draws: the step must fill
    assert drawn == [12, 8, 3] and trainer._refilled == 23

    # step() logs the count and whether the bound was reached, and restores filtering for the next step
    refills = [20, 4]  # the prompts each step's buffer draws

    def verl_step(self, metrics, timing_raw):
        self._add_prompts_to_generate(refills.pop(0))
        return "batch"

    monkeypatch.setattr(PPOTrainerSync, "step", verl_step)
    monkeypatch.setattr("envace.train.verl_ext.trainer.check_rollout_agreement", lambda *a, **k: {})
    for capped in (1, 0):
        metrics: dict = {}
        assert trainer.step(metrics, {}) == "batch" and buffer.filter_groups_metric == "reward"
        assert metrics["envace/filter_groups/refilled_prompts"] == (20 if capped else 4)
        assert metrics["envace/filter_groups/capped"] == capped
    trainer.max_refill, trainer._refilled = 0, 0  # no bound
    assert trainer._add_prompts_to_generate(1000) == 1000 and buffer.filter_groups_metric == "reward"

