"""The per-role-policy trainer for verl 0.9.1 (``trainer.v1.trainer_mode=envace_per_role_sync``).

A subclass of :class:`envace.train.verl_ext.trainer.EnvaceTrainer` (role-aware advantage groups, one optimizer
step per batch, verl's sync mode) that trains **two policies with separate parameters**, both from the
same base model: ACT (verl's own actor/rollout worker group and its vLLM replicas) and REHEARSE (a second
worker group built the same way on its own resource pool, with its own replicas and weight sync). The
layout helpers are in :mod:`envace.train.verl_ext.per_role`. verl 0.9.1 hooks used, no fork:

- ``_init_resource_pool_mgr``: adds the REHEARSE pool (``envace.per_role.rehearse_nnodes x
  rehearse_n_gpus_per_node``) next to verl's ``global_pool`` (the ACT policy, ``trainer.nnodes x
  trainer.n_gpus_per_node``); verl's GPU availability check then counts both.
- ``_setup``: after verl's setup (ACT side, its resume), builds the REHEARSE worker group from the same
  ``actor_rollout_ref`` config, its rollout replicas and a ``CheckpointEngineManager``; the trainer's
  ``checkpoint_manager`` becomes :class:`PairedWeightSync`, so verl's sync-mode hooks (update weights
  after loading and after each step, sleep after sampling) act on both policies.

The second policy's servers and weight sync (the verl coupling; each is a narrow subclass or verl's
documented worker environment; no verl function is copied):

- replica ranks are global: the REHEARSE replicas take ranks ``n_act .. n_act + k - 1`` (``n_act`` = the
  ACT replicas), so their Ray actor names (``vllm_server_<rank>_<node>``) and weight sockets are unique.
- :class:`PolicyServerManager` (subclass of verl's ``LLMServerManager``, only ``_initialize_llm_servers``):
  verl's ``RolloutReplica.init_hybrid`` takes a replica's workers as ``workers[world_size * rank :
  world_size * (rank + 1)]`` by its *global* rank, past the end of the REHEARSE group (verl's
  ``AssertionError: worker number 0 not equal to world size 1``); the manager lends ``init_hybrid`` a
  view in which the group's workers sit at their global positions (:class:`_WorkersAtGlobalRanks`).
- :class:`OwnServerActorRolloutRefWorker` (subclass of verl's ``ActorRolloutRefWorker``, only
  ``init_model``) + the worker environment ``ENVACE_ROLLOUT_REPLICA_OFFSET`` (``RayWorkerGroup``'s
  ``worker_env``): verl's trainer-side ``ServerAdapter`` derives the server it addresses and the weight
  socket from ``RANK // rollout_world_size``, the rank *within its own group*, so without this the
  REHEARSE workers push their weights to the ACT server and the REHEARSE server keeps its dummy initial
  weights (measured: REHEARSE rollout-vs-actor correlation 0.002). The subclass rebuilds the adapter
  through verl's own ``replica_rank`` argument, offset by the variable; unset it is verl's worker.
- test switch ``ENVACE_TEST_SKIP_REHEARSE_SYNC`` (``all`` | ``after_first``, read in ``_setup``): skips
  REHEARSE weight syncs, the negative control of the agreement guard
  (:func:`envace.train.verl_ext.trainer.check_rollout_agreement`, per role here: ``act`` =
  ``training/rollout_actor_probs_pearson_corr``, ``rehearse`` = ``rehearse/training/...``).

- ``get_llm_client``: verl's ``TaskRunnerV1`` builds the agent-loop manager from it; it returns a
  :class:`envace.train.verl_ext.per_role.RoleRoutingClient`, and the agent loop sends ACT turns to the ACT
  policy's servers and REHEARSE replies to the REHEARSE policy's servers.
- ``_step_once``: sample (verl's replay buffer), split the rows by ``envace_role`` (padding rows are
  cleared; each part is re-padded for its own worker group), per role: balance, old log-probs (and
  reference log-probs when the KL loss is on) on that role's policy; role-wise advantages **once on the
  union** (groups ``(prompt uid, role)``, exactly as in the shared run); the role batches are then cut
  from the batch meta the advantage step returns (it lists the ``advantages`` it wrote; a meta taken
  before it does not, and verl's loss fails with ``KeyError 'advantages'``); then each policy's update
  with only its own rows (``_update_actor`` of :class:`EnvaceTrainer`: one optimizer step per batch per
  policy). A role with no rows in a step is not updated that step. REHEARSE metrics are logged as
  ``rehearse_actor/*`` / ``rehearse/*`` (verl's ``actor/*`` names stay the ACT policy's). This method
  re-implements the order of verl's ``PPOTrainer._step_once`` (each stage is verl's own method; the
  sequence is ours): verl's step has no hook between the advantage and the update where the batch could
  be split by policy. :mod:`envace.train.verl_ext.coupling` fingerprints verl's ``_step_once`` (and every
  other
  verl member used here), so a change there fails a test.
- ``_save_now`` (the deferred save, see :class:`EnvaceTrainer`) / ``_load_checkpoint``: the REHEARSE
  policy is saved to ``global_step_<N>/rehearse_actor`` before verl saves the ACT policy (``actor``),
  ``data.pt`` and the tracker; on resume both are loaded from the same step, and a step folder without
  the REHEARSE policy is an error, never a silent restart from the base model.

The base methods that address "the" actor (``_balance_batch``, ``_compute_old_log_prob``,
``_compute_ref_log_prob``, ``_update_actor``) are reused for the REHEARSE policy by pointing
``actor_rollout_wg`` (and the colocated reference) at the REHEARSE worker group for the duration of the
call (:meth:`PerRoleTrainer._policy`); verl has no worker-group parameter on them.

Verified on CPU (tests/train/verl_ext/test_per_role_trainer.py), with stand-in worker groups and TransferQueue
reads: the trainer is constructed from the composed ``per_role_8b`` config (sync replay buffer); both
pools are in verl's resource-pool spec; the step routes each role's rows to its own worker group for
log-probs (and reference log-probs) and updates, computes advantages once on the union and hands each
update the post-advantage meta; sampled padding rows are cleared; both weight syncs run in verl's sync
hooks, and the test switch skips REHEARSE's; verl's real ``init_hybrid`` gives each REHEARSE replica its
own workers (1-3 ACT replicas, 1-4 REHEARSE workers, TP 1 and 2); the worker subclass offsets the
adapter's replica rank; the checkpoint layout and save order; resume loads both policies from one step
and refuses a step folder without the REHEARSE policy.
Verified through verl's real ``main_ppo`` on CPU (tests/train/verl_ext/test_per_role_main_ppo.py, one
replica per policy, tiny model): both roles' rows trained, both policies in sync (rollout-vs-actor
correlation), checkpointed and resumed through verl's resume (both loaded); with the REHEARSE sync skipped
(``ENVACE_TEST_SKIP_REHEARSE_SYNC=all``) the guard stops the run at step 1 before any checkpoint (numbers:
docs/measurements.md, "Numbers behind design choices in the code"). Resume is tested where a cluster needs
it: in CI's smoke DAG through Slurm the job is ``scancel``-ed after its first checkpoint and Snakemake's
retry resumes both policies from that step (verl's line for ACT, ours for REHEARSE;
``benchmarks/faults.py``), and every step logs both agreements >= 0.99 (``check_smoke_training.py``).
NOT verified: more than one replica per policy through Ray (unit-tested only), multi-node, GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from verl.single_controller.base.decorator import Dispatch, register
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.utils.debug import marked_timer
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.rollout.llm_server import LLMServerManager

from envace.train.verl_ext.per_role import (
    REHEARSE_POOL,
    ROLES,
    TRAINER_MODE,
    RoleRoutingClient,
    check_per_role_config,
    rehearse_checkpoint_dir,
    resume_step_dir,
    split_batch_by_role,
)
from envace.train.verl_ext.trainer import AGREEMENT_METRIC, EnvaceTrainer

__all__ = [
    "REPLICA_OFFSET_ENV",
    "SKIP_REHEARSE_SYNC_ENV",
    "OwnServerActorRolloutRefWorker",
    "PairedWeightSync",
    "PerRoleTrainer",
    "PolicyServerManager",
    "prefix_metrics",
]

REHEARSE_ROLE_KEY = "envace_rehearse_actor_rollout"  # the REHEARSE pool's key in verl's pool mapping

#: Worker environment of the REHEARSE worker group: the number of rollout replicas before its own (the
#: ACT policy's). verl's trainer-side ``ServerAdapter`` derives the server it addresses
#: (``vllm_server_<replica>_<node>``) and the weight-transfer socket (``...-replica-<replica>-rank-<r>``)
#: from the worker's rank within its own group; the offset makes them the REHEARSE replicas'.
REPLICA_OFFSET_ENV = "ENVACE_ROLLOUT_REPLICA_OFFSET"

#: Test switch (negative control), read by the trainer: ``all`` skips every REHEARSE weight sync (its
#: servers keep their dummy initial weights: the defect the agreement guard exists for), ``after_first``
#: skips every sync after the initial one. Unset or empty: both policies are synced at every step.
SKIP_REHEARSE_SYNC_ENV = "ENVACE_TEST_SKIP_REHEARSE_SYNC"


class OwnServerActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's ``ActorRolloutRefWorker`` whose rollout adapter addresses its own policy's replicas.

    After verl's ``init_model`` the rollout adapter (verl's ``ServerAdapter``) is rebuilt through its own
    ``replica_rank`` argument as ``<verl's replica rank> + $ENVACE_ROLLOUT_REPLICA_OFFSET``; verl derives
    the server actor name and the weight-transfer socket from that rank. Without the variable (or 0) it
    is verl's worker unchanged.
    """

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        super().init_model()
        offset = int(os.environ.get(REPLICA_OFFSET_ENV, "0") or 0)
        rollout = getattr(self, "rollout", None)
        if offset and rollout is not None:
            self.rollout = type(rollout)(
                config=rollout.config,
                model_config=rollout.model_config,
                device_mesh=rollout.device_mesh,
                replica_rank=rollout.replica_rank + offset,
            )


class _WorkersAtGlobalRanks:
    """A worker group as verl's ``RolloutReplica.init_hybrid`` reads it (``workers``), with the group's
    workers placed at their replicas' global positions: ``init_hybrid`` slices
    ``workers[world_size * replica_rank : world_size * (replica_rank + 1)]`` by the replica's global rank."""

    def __init__(self, group: Any, first_worker: int) -> None:
        self._group = group
        self.workers = [None] * first_worker + list(group.workers)
        self.world_size = group.world_size  # verl sizes the replica count by the real group

    def __getattr__(self, name: str) -> Any:
        return getattr(self._group, name)


class PolicyServerManager(LLMServerManager):
    """verl's ``LLMServerManager`` for a second policy's own worker group.

    Its replicas take the global ranks ``start_rank ..`` (unique Ray actor names, the ranks the workers'
    adapters address, see :class:`OwnServerActorRolloutRefWorker`) while each replica's workers are taken
    from this group by its local index (:class:`_WorkersAtGlobalRanks`). Any number of replicas.
    """

    async def _initialize_llm_servers(self, start_rank: int | None = None) -> None:
        first = self.start_rank if start_rank is None else start_rank
        group = self.worker_group
        if group is None or not first:
            return await super()._initialize_llm_servers(start_rank)
        rc = self.rollout_config
        per_replica = (
            rc.tensor_model_parallel_size * rc.data_parallel_size * rc.pipeline_model_parallel_size
        )
        self.worker_group = _WorkersAtGlobalRanks(group, first * per_replica)
        try:
            return await super()._initialize_llm_servers(start_rank)
        finally:
            self.worker_group = group


class PairedWeightSync:
    """verl's ``CheckpointEngineManager`` interface over several managers (ACT, then REHEARSE).

    ``skip``: ``{manager index: "all" | "after_first"}``, the test switch :data:`SKIP_REHEARSE_SYNC_ENV`.
    """

    def __init__(self, managers: list[Any], skip: dict[int, str] | None = None) -> None:
        self.managers = list(managers)
        self.skip = dict(skip or {})
        self.synced = [0] * len(self.managers)

    def update_weights(self, global_steps: int | None = None) -> dict:
        out: dict = {}
        for i, m in enumerate(self.managers):
            mode = self.skip.get(i)
            if mode == "all" or (mode == "after_first" and self.synced[i] >= 1):
                print(f"envace: {SKIP_REHEARSE_SYNC_ENV}={mode}: weight sync {i} skipped", flush=True)
                continue
            out.update(m.update_weights(global_steps) or {})
            self.synced[i] += 1
        return out

    def sleep_replicas(self) -> None:
        for m in self.managers:
            m.sleep_replicas()

    def wake_up_replicas(self) -> None:
        for m in self.managers:
            m.wake_up_replicas()


def split_union(union: Any, counts: dict[str, int]) -> dict[str, Any]:
    """Cut ``union`` (roles' rows concatenated in ``counts`` order) back into one batch meta per role."""
    if sum(counts.values()) != len(union.keys):
        raise ValueError(f"{len(union.keys)} rows in the union but {sum(counts.values())} expected")
    out, start = {}, 0
    for role, n in counts.items():
        out[role] = union.select_keys(list(union.keys[start:start + n]))
        start += n
    return out


def prefix_metrics(metrics: dict[str, Any], role: str) -> dict[str, Any]:
    """ACT metrics unchanged; REHEARSE ``actor/x`` -> ``rehearse_actor/x``, others -> ``rehearse/x``."""
    if role == "act":
        return dict(metrics)
    out = {}
    for k, v in metrics.items():
        if k.startswith("actor/"):
            out["rehearse_actor/" + k[len("actor/"):]] = v
        elif k.startswith("perf/mfu/actor"):
            out[k.replace("perf/mfu/actor", "perf/mfu/rehearse_actor", 1)] = v
        else:
            out["rehearse/" + k] = v
    return out


@register_trainer(TRAINER_MODE)
class PerRoleTrainer(EnvaceTrainer):
    """Two policies (ACT, REHEARSE) with separate parameters; see the module docstring."""

    agreement_by_role = False  # each old-log-prob pass is one role's rows already

    def __init__(self, config: Any) -> None:
        check_per_role_config(config)
        super().__init__(config)
        self.rehearse_wg: Any = None

    # ------------------------------------------------------------------ set-up (GPU path)

    def _init_resource_pool_mgr(self) -> None:
        from verl.single_controller.ray import ResourcePoolManager

        super()._init_resource_pool_mgr()
        per_role = self.config.envace.per_role
        spec = dict(self.resource_pool_manager.resource_pool_spec)
        spec[REHEARSE_POOL] = [int(per_role.rehearse_n_gpus_per_node)] * int(per_role.rehearse_nnodes)
        mapping = dict(self.resource_pool_manager.mapping)
        mapping[REHEARSE_ROLE_KEY] = REHEARSE_POOL
        self.resource_pool_manager = ResourcePoolManager(resource_pool_spec=spec, mapping=mapping)

    def _setup(self) -> None:
        super()._setup()  # the ACT policy: worker group, replicas, weight sync, resume (sets global_steps)
        self._setup_rehearse_policy()
        self._load_rehearse_checkpoint()

    def _setup_rehearse_policy(self) -> None:
        import ray
        from verl.checkpoint_engine import CheckpointEngineManager
        from verl.single_controller.ray import (
            RayClassWithInitArgs,
            RayWorkerGroup,
            create_colocated_worker_cls,
        )
        from verl.trainer.ppo.utils import Role
        from verl.utils.config import omega_conf_to_dataclass

        skip = os.environ.get(SKIP_REHEARSE_SYNC_ENV, "")
        if skip not in ("", "all", "after_first"):
            raise ValueError(f"{SKIP_REHEARSE_SYNC_ENV}={skip!r}: expected all, after_first or unset")
        role = next(r for r in (Role.ActorRolloutRef, Role.ActorRollout) if r in self.role_worker_mapping)
        pool = self.resource_pool_manager.get_resource_pool(REHEARSE_ROLE_KEY)
        act_replicas = len(self.llm_server_manager.get_replicas())
        worker = RayClassWithInitArgs(
            cls=ray.remote(OwnServerActorRolloutRefWorker),  # verl's worker + the replica offset below
            config=self.config.actor_rollout_ref,  # same base model and hyperparameters as ACT
            distillation_config=self.config.get("distillation"),
            role=str(role),
        )
        group = RayWorkerGroup(
            resource_pool=pool,
            ray_cls_with_init=create_colocated_worker_cls(class_dict={str(role): worker}),
            device_name=self.config.trainer.device,
            worker_env={REPLICA_OFFSET_ENV: str(act_replicas)},
        )
        self.rehearse_wg = group.spawn(prefix_set=[str(role)])[str(role)]
        self.rehearse_wg.init_model()
        self.rehearse_server_manager = PolicyServerManager.create(
            config=self.config,
            worker_group=self.rehearse_wg,
            rollout_resource_pool=pool,
            start_rank=act_replicas,  # global replica ranks after ACT's: unique server names and sockets
        )
        engine_cfg = omega_conf_to_dataclass(self.config.actor_rollout_ref.rollout.checkpoint_engine)
        engine_cfg.backend = "naive"  # colocated train + rollout on the REHEARSE pool, as verl does for ACT
        rehearse_sync = CheckpointEngineManager(
            config=engine_cfg, actor_wg=self.rehearse_wg, replicas=self.rehearse_server_manager.get_replicas()
        )
        rehearse_sync.sleep_replicas()
        self.checkpoint_manager = PairedWeightSync(
            [self.checkpoint_manager, rehearse_sync], skip={1: skip} if skip else None
        )

    def get_llm_client(self) -> RoleRoutingClient:
        clients = {"act": self.llm_server_manager, "rehearse": self.rehearse_server_manager}
        return RoleRoutingClient({role: manager.get_client() for role, manager in clients.items()})

    def _rollout_server_managers(self) -> list:
        extra = getattr(self, "rehearse_server_manager", None)
        return [*super()._rollout_server_managers(), *([extra] if extra is not None else [])]

    # ------------------------------------------------------------------ checkpoints

    def _save_now(self) -> None:  # the deferred save of EnvaceTrainer._save_checkpoint: both policies
        import os

        step_dir = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        remote = self.config.trainer.get("default_hdfs_dir", None)
        if remote is not None:
            remote = rehearse_checkpoint_dir(os.path.join(remote, f"global_step_{self.global_steps}"))
        self.rehearse_wg.save_checkpoint(
            rehearse_checkpoint_dir(step_dir),
            remote,
            self.global_steps,
            max_ckpt_to_keep=self.config.trainer.get("max_actor_ckpt_to_keep", None),
        )
        super()._save_now()  # ACT (actor/), data.pt, then the tracker

    def _load_checkpoint(self) -> None:
        super()._load_checkpoint()
        if self.rehearse_wg is not None:  # during verl's _setup it does not exist yet: see _setup
            self._load_rehearse_checkpoint()

    def _load_rehearse_checkpoint(self) -> None:
        import os

        step_dir = resume_step_dir(self.config.trainer, self.global_steps)
        if step_dir is None:
            return
        path = rehearse_checkpoint_dir(step_dir)
        if not os.path.isdir(path):
            raise FileNotFoundError(
                f"resuming the per-role run at {step_dir}, but the REHEARSE policy ({path}) is missing: "
                "refusing to continue with a REHEARSE policy reset to the base model"
            )
        self.rehearse_wg.load_checkpoint(
            local_path=path, del_local_after_load=self.config.trainer.del_local_ckpt_after_load
        )
        print(f"envace: REHEARSE policy resumed from {path} (step {self.global_steps})", flush=True)

    # ------------------------------------------------------------------ one step

    @contextmanager
    def _policy(self, role: str) -> Iterator[None]:
        """Point verl's actor (and a colocated reference) at ``role``'s worker group for the block."""
        if role == "act":
            yield
            return
        saved_actor = self.actor_rollout_wg
        saved_ref = getattr(self, "ref_policy_wg", None)
        self.actor_rollout_wg = self.rehearse_wg
        if saved_ref is not None and saved_ref is saved_actor:
            self.ref_policy_wg = self.rehearse_wg
        try:
            yield
        finally:
            self.actor_rollout_wg = saved_actor
            if saved_ref is not None:
                self.ref_policy_wg = saved_ref

    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> Any:
        import transfer_queue as tq
        from transfer_queue import KVBatchMeta

        with marked_timer("gen", timing_raw, color="red"):
            self.on_sample_begin()
            batch, off_policy = self.replay_buffer.sample(
                global_steps=self.global_steps, partition_id="train", batch_size=sample_batch_size
            )
            metrics.update(off_policy)
            batch.extra_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
            self.on_sample_end()
        if self.reward_loop_manager.reward_loop_worker_handles is None:
            with marked_timer("reward", timing_raw, color="yellow"):
                batch = self._compute_reward_colocate(batch, metrics=metrics)

        parts, padding = split_batch_by_role(batch, self._row_roles(batch))
        if not parts:
            raise RuntimeError(f"step {self.global_steps}: the sampled batch has only padding rows")
        if len(padding):
            tq.kv_clear(keys=padding.keys, partition_id=padding.partition_id)
        metrics.update({f"envace/rows/{r}": len(parts[r]) if r in parts else 0 for r in ROLES})
        for role in list(parts):
            role_metrics: dict = {}
            with self._policy(role), marked_timer(f"old_log_prob_{role}", timing_raw, color="blue"):
                part = self._balance_batch(parts[role], metrics=role_metrics)
                part = self._compute_old_log_prob(part, metrics=role_metrics)
                if self.use_reference_policy:
                    part = self._compute_ref_log_prob(part, metrics=role_metrics)
            parts[role] = part
            metrics.update(prefix_metrics(role_metrics, role))

        order = [r for r in ROLES if r in parts]
        union = KVBatchMeta.concat([parts[r] for r in order])
        with marked_timer("adv", timing_raw, color="brown"):
            union = self._compute_advantage(union, metrics=metrics)  # role-wise, over both roles' rows
        # verl's advantage step returns a new batch meta that lists the fields it wrote (advantages,
        # returns); the update reads only the fields its meta lists, so each role's batch is cut from it
        parts = split_union(union, {r: len(parts[r]) for r in order})

        if self.config.trainer.critic_warmup <= self.global_steps:
            for role in order:
                role_metrics = {}
                with self._policy(role), marked_timer(f"update_actor_{role}", timing_raw, color="red"):
                    self._update_actor(parts[role], metrics=role_metrics)
                metrics.update(prefix_metrics(role_metrics, role))
        return union

    def _rollout_agreement_metrics(self) -> dict[str, str]:
        return {"act": AGREEMENT_METRIC, "rehearse": "rehearse/" + AGREEMENT_METRIC}
