"""Compose a run's verl config: our Hydra file + overrides generated from ``config/config.yaml``.

Implemented: :func:`run_overrides` turns ``training.runs.<run>`` (the single source of truth) into Hydra
override strings for verl's ``ppo_trainer`` (its ``episode`` block -> ``envace.terminate_on_rehearsal_error``,
``envace.replay_user_turns``, ``envace.context_budget``, ``envace.rehearsal_prompt``, ``envace.turn_cap``,
``envace.max_env_steps``, ``algorithm.envace_singleton_advantage``, ``algorithm.envace_advantage_sign``,
``algorithm.envace_rehearse_advantage``);
:func:`compose` composes ``envace/train/verl_ext/config/<run>.yaml``
(which holds only differences from verl's defaults) with those overrides using Hydra's compose API, the
same composition ``python -m verl.trainer.main_ppo --config-path ... --config-name <run>`` performs.
Composition runs on CPU (no Ray, no GPU); the tests assert the paper's values on the result.

A per-role run (``roles: per_role``) trains two policies: its ``nodes x gpus_per_node`` (the GPUs the
training rule reserves) are split half/half by :func:`envace.train.verl_ext.per_role.split_nodes` into verl's
``trainer.nnodes / n_gpus_per_node`` (the ACT policy) and ``envace.per_role.rehearse_nnodes /
rehearse_n_gpus_per_node`` (the REHEARSE policy).

Smoke scale (``gpus_per_node: 0``): the same composition plus the CPU platform's overrides
(``config/_cpu_overrides.yaml``: FSDP2, sdpa, no sleep mode, ...) and one fake Ray GPU per policy
(verl's CPU platform, :mod:`envace.train.verl_ext.cpu`); the run's own values still come from ``config.yaml``.
The run's ``nodes`` hold (:func:`cpu_layout`): ``nodes: 2`` is two Slurm nodes of one fake GPU each (the
per-role run: one policy per node), as on a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from envace.common.config import episode_rules
from envace.common.settings import training_loggers
from envace.train.verl_ext.padding import AUTHORS_ROWS_PER_GPU
from envace.train.verl_ext.per_role import split_nodes

__all__ = ["CONFIG_DIR", "RUN_FILES", "run_config_name", "run_overrides", "cpu_overrides", "cpu_layout",
           "compose"]

CONFIG_DIR = Path(__file__).resolve().parent / "config"
RUN_FILES = {p.stem for p in CONFIG_DIR.glob("*.yaml") if not p.stem.startswith("_")}
def run_config_name(cfg: Mapping[str, Any], run: str) -> str:
    """The Hydra file for ``run``: its own file if there is one, else the file of its algorithm/roles."""
    if run in RUN_FILES:
        return run
    spec = cfg["training"]["runs"][run]
    if spec.get("roles") == "per_role":
        return "per_role_8b"
    return "grpo_8b" if spec.get("algorithm") == "grpo" else "envace_8b"


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(_fmt(v) for v in value) + "]"
    return str(value)


def run_overrides(
    cfg: Mapping[str, Any],
    run: str,
    checkpoint_dir: str | None = None,
    train_files: str | None = None,
    val_files: str | None = None,
) -> list[str]:
    """Hydra overrides for ``run`` from ``training.runs.<run>`` (plus paths), in a fixed order.

    ``checkpoint_dir`` -> ``trainer.default_local_dir`` with ``resume_mode=auto`` (verl resumes from the
    newest ``global_step_*`` there). Raises ``KeyError`` naming a missing run.
    """
    runs = cfg["training"]["runs"]
    if run not in runs:
        raise KeyError(f"unknown run {run!r}; training.runs has {sorted(runs)}")
    r = runs[run]
    kl = r.get("kl", {}) or {}
    ep = episode_rules(r)
    o = {
        "actor_rollout_ref.model.path": r["base_model"],
        "actor_rollout_ref.actor.optim.lr": r["lr"],
        "data.train_batch_size": r["prompts_per_step"],
        "actor_rollout_ref.actor.ppo_mini_batch_size": r["prompts_per_step"],
        "actor_rollout_ref.rollout.n": r["rollouts_per_prompt"],
        "data.max_prompt_length": r["max_prompt_tokens"],
        "data.max_response_length": r["max_response_tokens"],
        "envace.max_turns": r["max_turns"],
        "actor_rollout_ref.actor.clip_ratio": r["clip_ratio"],
        # verl 0.9.1 reads the two one-sided ratios, not clip_ratio (core_algos.compute_policy_loss)
        "actor_rollout_ref.actor.clip_ratio_low": r["clip_ratio"],
        "actor_rollout_ref.actor.clip_ratio_high": r["clip_ratio"],
        "actor_rollout_ref.actor.clip_ratio_c": r["dual_clip"],
        "actor_rollout_ref.actor.loss_agg_mode": r["loss_agg_mode"],
        "actor_rollout_ref.actor.entropy_coeff": r["entropy_coef"],
        "actor_rollout_ref.actor.use_kl_loss": bool(kl.get("use_kl_loss", False)),
        "envace.use_kl_loss": bool(kl.get("use_kl_loss", False)),
        "actor_rollout_ref.actor.kl_loss_coef": kl.get("coef", 1.0e-4),
        "actor_rollout_ref.rollout.temperature": r["rollout_temperature"],
        "trainer.total_training_steps": r["total_steps"],
        "trainer.save_freq": r["save_every"],
        "trainer.test_freq": r["val_every"],
        "trainer.nnodes": r["nodes"],
        "trainer.n_gpus_per_node": r["gpus_per_node"],
        "trainer.experiment_name": run,
        "trainer.logger": training_loggers(cfg["training"]),  # training.loggers
        "envace.precheck": r.get("precheck", "none"),
        "envace.roles": r.get("roles", "shared"),
        "envace.mode": "external_simulator" if r.get("algorithm") == "grpo" else "rehearsal",
        "envace.batch_padding": str(r.get("batch_padding", "mask")),
        "envace.padding_multiple": AUTHORS_ROWS_PER_GPU * max(1, int(r["nodes"]) * int(r["gpus_per_node"])),
        # episode / update rules (training.runs.<run>.episode; defaults = the authors' code)
        "envace.terminate_on_rehearsal_error": bool(ep["terminate_on_rehearsal_error"]),
        "envace.terminate_on_rehearsal_malformed": bool(ep["terminate_on_rehearsal_malformed"]),
        "envace.rehearse_max_tokens": int(ep["rehearse_max_tokens"]),
        "envace.rehearse_truncation": str(ep["rehearse_truncation"]),
        "envace.rehearse_think_switch": bool(ep["rehearse_think_switch"]),
        "data.apply_chat_template_kwargs.enable_thinking": bool(ep["enable_thinking"]),
        "envace.replay_user_turns": bool(ep["replay_user_turns"]),
        "envace.context_budget": ep["context_budget"],
        "envace.rehearsal_prompt": ep["rehearsal_prompt"],
        "envace.turn_cap": ep["turn_cap"],
        "envace.max_env_steps": int(ep["max_env_steps"]),
        "algorithm.envace_singleton_advantage": ep["singleton_advantage"],
        "algorithm.envace_advantage_sign": int(ep["advantage_sign"]),
        "algorithm.envace_rehearse_advantage": ep["rehearse_advantage"],
    }
    group_filter = r.get("filter_groups") or {}
    if group_filter.get("enable"):  # verl's own DAPO group filtering on the run's reward (rm_scores)
        o["algorithm.filter_groups.enable"] = True
        o["algorithm.filter_groups.metric"] = "reward"
        inflight = int(group_filter.get("max_inflight_gen_batches", 1))
        o["algorithm.filter_groups.max_inflight_gen_batches"] = inflight
    if r.get("seed") is not None:  # else verl's defaults (data.seed null, rollout.seed 42)
        o["data.seed"] = int(r["seed"])
        o["actor_rollout_ref.rollout.seed"] = int(r["seed"])
    if r.get("algorithm") == "grpo":
        o["envace.simulator.model"] = r["simulator"]
        for key, value in (r.get("simulator_sampling") or {}).items():  # the authors' caller-only values
            o[f"envace.simulator.{key}"] = float(value)
        o["envace.simulator.protocol"] = str(r.get("simulator_protocol", "rehearsal"))
        o["envace.simulator.attempts"] = int(r.get("simulator_attempts", 5))
    cpu = int(r["gpus_per_node"]) == 0
    if cpu:  # smoke scale: verl's CPU platform (envace.train.verl_ext.cpu), one fake Ray GPU per policy
        nodes, fake_gpus = cpu_layout(r)
        o["trainer.nnodes"], o["trainer.n_gpus_per_node"] = nodes, fake_gpus
    if r.get("roles") == "per_role":  # nodes x gpus_per_node = both policies' pools (per_role.split_nodes)
        split = split_nodes(o["trainer.nnodes"], o["trainer.n_gpus_per_node"])
        o["trainer.nnodes"] = split["act_nnodes"]
        o["trainer.n_gpus_per_node"] = split["act_gpus_per_node"]
        o["envace.per_role.rehearse_nnodes"] = split["rehearse_nnodes"]
        o["envace.per_role.rehearse_n_gpus_per_node"] = split["rehearse_gpus_per_node"]
    ev = cfg.get("evaluation", {}).get("sampling", {})
    if ev:
        o["actor_rollout_ref.rollout.val_kwargs.temperature"] = ev["temperature"]
        o["actor_rollout_ref.rollout.val_kwargs.top_p"] = ev["top_p"]
    if cpu:
        o.update(cpu_overrides())
        # verl's dynamic batching refuses a row longer than a micro-batch: the CPU file's small micro-batch
        # grows to hold this run's longest row
        tok = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
        o[tok] = max(int(o[tok]), int(r["max_prompt_tokens"]) + int(r["max_response_tokens"]))
        o["+ray_kwargs.ray_init.num_gpus"] = fake_gpus  # per node (the launcher's --gpus-per-node)
    if checkpoint_dir is not None:
        o["trainer.default_local_dir"] = checkpoint_dir
        o["trainer.resume_mode"] = "auto"
    if train_files is not None:
        o["data.train_files"] = train_files
        o["data.val_files"] = val_files or train_files
    return [f"{k}={_fmt(v)}" for k, v in o.items()]


def cpu_layout(run: Mapping[str, Any]) -> tuple[int, int]:
    """``(nodes, fake GPUs per node)`` of a CPU run (``gpus_per_node: 0``): one fake GPU per policy, on
    the run's ``nodes``. One node: 1 (2 for a per-role run, one per policy); more nodes: 1 per node, so
    a per-role run on 2 nodes puts each policy on its own node."""
    nodes = int(run["nodes"])
    if run.get("roles") == "per_role" and nodes not in (1, 2):
        raise ValueError("a per-role CPU run trains one policy per fake GPU: nodes must be 1 or 2, "
                         f"not {nodes}")
    return nodes, (2 if run.get("roles") == "per_role" and nodes == 1 else 1)


def cpu_overrides() -> dict[str, Any]:
    """The CPU platform's overrides (``config/_cpu_overrides.yaml``), in file order."""
    import yaml

    with open(CONFIG_DIR / "_cpu_overrides.yaml") as fh:
        return dict(yaml.safe_load(fh))


def compose(config_name: str, overrides: list[str] | None = None) -> Any:
    """Compose ``config/<config_name>.yaml`` with verl's ``ppo_trainer`` and ``overrides``.

    Returns the ``DictConfig`` (unresolved, as main_ppo receives it).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if config_name not in RUN_FILES:
        raise KeyError(f"no Hydra run file {config_name!r} in {CONFIG_DIR}; have {sorted(RUN_FILES)}")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra_compose(config_name=config_name, overrides=list(overrides or []))
