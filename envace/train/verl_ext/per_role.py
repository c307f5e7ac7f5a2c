"""The per-role-policy ablation (``per_role_8b``, paper Fig. 3): the parts that need neither Ray nor a GPU.

The per-role run trains two policies with **separate parameters**, both initialised from the same base
model: the ACT policy (verl's own actor/rollout worker group, ``trainer.nnodes x trainer.n_gpus_per_node``
GPUs) and the REHEARSE policy (a second actor/rollout worker group on its own resource pool,
``envace.per_role.rehearse_nnodes x envace.per_role.rehearse_n_gpus_per_node`` GPUs). The trainer that
drives them is :mod:`envace.train.verl_ext.per_role_trainer`; this module holds what it is built from:

- :func:`split_nodes`: how a run's ``nodes x gpus_per_node`` (``config.yaml``, the GPUs the training
  rule reserves) are divided between the two policies: half each (whole nodes when ``nodes`` is even,
  half of each node's GPUs when ``nodes == 1``), so the reservation always equals what the job uses.
- :class:`RoleRoutingClient`: what the trainer hands verl's agent-loop manager instead of one
  ``LLMServerClient``: ``generate`` (verl's interface) goes to the ACT policy's servers and
  :meth:`RoleRoutingClient.role_client` gives the agent loop each role's own client, so ACT turns are
  sampled from the ACT policy and REHEARSE replies from the REHEARSE policy
  (:class:`envace.train.verl_ext.agent_loop.EnvaceAgentLoop` with ``envace.roles=per_role``).
- :func:`role_row_indices` / :func:`split_batch_by_role`: a step's rows split by their
  ``envace_role`` (padding rows apart), so each policy's old log-probs and update see only its own rows.
- :func:`rehearse_checkpoint_dir` / :func:`resume_step_dir`: the checkpoint layout. verl writes
  ``<default_local_dir>/global_step_<N>/actor`` (the ACT policy) and ``data.pt``; the REHEARSE policy goes
  to ``global_step_<N>/rehearse_actor``, written **before** verl writes
  ``latest_checkpointed_iteration.txt``, so the tracker never names a step with only one policy saved.
- :func:`check_per_role_config`: the settings the per-role trainer supports, refused early with a clear
  message otherwise.

Why two worker groups and not one model with two LoRA adapters: the paper's ablation is *separate
parameters*; two adapters on a shared frozen base share most of the network and would be a different
ablation. Why a separate resource pool and not a second worker group colocated on the same GPUs: in a
trajectory ACT and REHEARSE generations interleave, so both policies' inference servers must be awake at
once; colocating two hybrid (train + vLLM) engines per GPU is not a layout verl 0.9.1 sets up.

Verified on CPU (tests/train/verl_ext/test_per_role.py): the node split, routing with stand-in clients, the
split of a batch (``KVBatchMeta`` and ``DataProto``), the checkpoint paths and the config checks; the
whole per-role run through verl's ``main_ppo`` in the smoke DAG (``benchmarks/check_smoke_training.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "ROLES",
    "REHEARSE_CHECKPOINT",
    "REHEARSE_POOL",
    "TRAINER_MODE",
    "RoleRoutingClient",
    "check_per_role_config",
    "rehearse_checkpoint_dir",
    "resume_step_dir",
    "role_row_indices",
    "split_batch_by_role",
    "split_nodes",
]

ROLES = ("act", "rehearse")
TRAINER_MODE = "envace_per_role_sync"
REHEARSE_POOL = "envace_rehearse_pool"
REHEARSE_CHECKPOINT = "rehearse_actor"


def split_nodes(nodes: int, gpus_per_node: int) -> dict[str, int]:
    """Divide a job's ``nodes x gpus_per_node`` GPUs between the ACT and REHEARSE policies, half each.

    Returns ``{"act_nnodes", "act_gpus_per_node", "rehearse_nnodes", "rehearse_gpus_per_node"}``.
    Even ``nodes``: ``nodes / 2`` whole nodes each. ``nodes == 1``: each policy gets half of the node's
    GPUs (``gpus_per_node`` must be even). Anything else raises ``ValueError``.
    """
    nodes, gpus = int(nodes), int(gpus_per_node)
    if nodes < 1 or gpus < 1:
        raise ValueError(f"per-role run needs GPUs; got nodes={nodes}, gpus_per_node={gpus}")
    if nodes % 2 == 0:
        half = nodes // 2
        return {"act_nnodes": half, "act_gpus_per_node": gpus, "rehearse_nnodes": half,
                "rehearse_gpus_per_node": gpus}
    if nodes == 1 and gpus % 2 == 0:
        return {"act_nnodes": 1, "act_gpus_per_node": gpus // 2, "rehearse_nnodes": 1,
                "rehearse_gpus_per_node": gpus // 2}
    raise ValueError(
        f"per-role run: {nodes} node(s) x {gpus} GPUs cannot be split evenly between the ACT and REHEARSE "
        "policies (use an even number of nodes, or one node with an even GPU count)"
    )


class RoleRoutingClient:
    """One client per role behind verl's ``LLMServerClient`` interface.

    ``generate(request_id, prompt_ids=..., sampling_params=..., **kw)`` goes to the ACT client (so any
    verl code that treats this as *the* policy client talks to the ACT policy); :meth:`role_client`
    returns the client of ``"act"`` or ``"rehearse"``. Plain attributes only, so it pickles into verl's
    agent-loop worker actors like the client it replaces.
    """

    def __init__(self, clients: Mapping[str, Any]) -> None:
        missing = [r for r in ROLES if r not in clients]
        if missing:
            raise ValueError(f"RoleRoutingClient needs a client for every role; missing {missing}")
        self.clients = {r: clients[r] for r in ROLES}

    def role_client(self, role: str) -> Any:
        """The client serving ``role`` (``"act"`` or ``"rehearse"``)."""
        if role not in self.clients:
            raise KeyError(f"unknown role {role!r}; roles are {list(ROLES)}")
        return self.clients[role]

    async def generate(self, request_id: str, **kwargs: Any) -> Any:
        """verl's ``generate``: the ACT policy's servers."""
        return await self.clients["act"].generate(request_id, **kwargs)

    @property
    def tokenizer(self) -> Any:
        return getattr(self.clients["act"], "tokenizer", None)

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:  # verl sets it for rollout tracing (token2text)
        for client in self.clients.values():
            client.tokenizer = value


def role_row_indices(roles: Sequence[str | None]) -> dict[str, list[int]]:
    """Row positions per role: ``{"act": [...], "rehearse": [...], "padding": [...]}`` (``None`` = padding).

    An unknown role raises ``ValueError`` (a row that neither policy may train on is a bug upstream).
    """
    out: dict[str, list[int]] = {"act": [], "rehearse": [], "padding": []}
    for i, role in enumerate(roles):
        key = "padding" if role is None else str(role)
        if key not in out:
            raise ValueError(f"row {i} has role {role!r}; expected one of {list(ROLES)} or padding")
        out[key].append(i)
    return out


def split_batch_by_role(batch: Any, roles: Sequence[str | None]) -> tuple[dict[str, Any], Any]:
    """Split a ``KVBatchMeta`` (keys, tags) into one sub-batch per role that has rows, and the padding rows.

    Returns ``({role: KVBatchMeta}, padding KVBatchMeta)``; a role with no rows in this batch is absent
    (its policy is not updated this step). Sub-batches keep the batch's ``partition_id`` and
    ``extra_info``; order within a role is the batch order.
    """
    if len(roles) != len(batch.keys):
        raise ValueError(f"{len(batch.keys)} rows but {len(roles)} roles")
    idx = role_row_indices(roles)
    parts = {r: batch.select_keys([batch.keys[i] for i in idx[r]]) for r in ROLES if idx[r]}
    return parts, batch.select_keys([batch.keys[i] for i in idx["padding"]])


def rehearse_checkpoint_dir(step_dir: str | os.PathLike[str]) -> str:
    """Where the REHEARSE policy of one ``global_step_<N>`` folder lives (verl's ACT policy: ``actor``)."""
    return os.path.join(os.fspath(step_dir), REHEARSE_CHECKPOINT)


def resume_step_dir(trainer_cfg: Mapping[str, Any], global_steps: int, cwd: str | None = None) -> str | None:
    """The ``global_step_<N>`` folder verl resumed from (``None`` when it started from scratch).

    Mirrors verl 0.9.1's ``PPOTrainer._load_checkpoint``: ``resume_mode=auto`` -> ``default_local_dir``
    (relative paths against the working directory) + ``global_step_<N>``; ``resume_path`` ->
    ``resume_from_path``; ``disable`` -> ``None``.
    """
    mode = trainer_cfg.get("resume_mode", "auto")
    if mode == "disable" or int(global_steps) <= 0:
        return None
    base = os.getcwd() if cwd is None else cwd
    if mode == "resume_path":
        path = str(trainer_cfg["resume_from_path"])
        return path if os.path.isabs(path) else os.path.join(base, path)
    if mode != "auto":
        raise ValueError(f"unknown trainer.resume_mode {mode!r}")
    root = str(trainer_cfg["default_local_dir"])
    root = root if os.path.isabs(root) else os.path.join(base, root)
    return os.path.join(root, f"global_step_{int(global_steps)}")


def check_per_role_config(config: Any) -> None:
    """Refuse settings the per-role trainer does not implement (``ValueError`` naming the key)."""
    envace = config.get("envace", None) or {}
    problems = []
    if envace.get("roles") != "per_role":
        problems.append(f"envace.roles must be per_role (got {envace.get('roles')!r})")
    if envace.get("mode", "rehearsal") != "rehearsal":
        problems.append(f"envace.mode must be rehearsal (got {envace.get('mode')!r}): the REHEARSE policy "
                        "is the trained second policy, not an external simulator")
    per_role = envace.get("per_role", None) or {}
    for key in ("rehearse_nnodes", "rehearse_n_gpus_per_node"):
        if int(per_role.get(key, 0) or 0) < 1:
            problems.append(f"envace.per_role.{key} must be >= 1")
    arr = config.actor_rollout_ref
    if not bool(arr.get("hybrid_engine", True)):
        problems.append("actor_rollout_ref.hybrid_engine must be true (each policy serves its own rollouts)")
    rollout = arr.get("rollout", None) or {}
    if rollout.get("name", "vllm") != "vllm":
        problems.append(f"actor_rollout_ref.rollout.name must be vllm (got {rollout.get('name')!r}): the "
                        "REHEARSE policy's servers are addressed through verl's vLLM ServerAdapter")
    if bool((rollout.get("disaggregation", None) or {}).get("enabled", False)):
        problems.append("actor_rollout_ref.rollout.disaggregation (prefill/decode) is not supported")
    lora = arr.model.get("lora", None) or {}
    if int(lora.get("rank", 0) or 0) > 0 or int(arr.model.get("lora_rank", 0) or 0) > 0:
        problems.append("LoRA is not supported: the ablation is two full sets of parameters")
    critic = config.get("critic", None) or {}
    if bool(critic.get("enable", False)) or config.algorithm.get("adv_estimator") == "gae":
        problems.append("a critic is not supported (role-wise GRPO needs none)")
    if problems:
        raise ValueError("per-role run: " + "; ".join(problems))
