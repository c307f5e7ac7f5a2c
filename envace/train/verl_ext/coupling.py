"""Every verl member envace's extension depends on beyond verl's registration points, in one list, with
a guard on the pinned verl version and a fingerprint of each member's source.

verl's documented extension points — ``register_adv_est``, ``register_trainer``, the agent-loop registry
and ``AgentLoopBase.run``, the platform plugin (``PlatformBase``'s abstract methods, implemented in
:mod:`envace.train.verl_ext.cpu.platform`) — are not listed: they are interfaces. Listed are the members of
verl classes that envace overrides, calls although they are private, re-implements, or relies on the
behaviour of (:class:`Coupling`). ``sha256`` is the SHA-256 (first 16 hex digits) of
``inspect.getsource`` of the member in verl 0.9.1: ``tests/train/verl_ext/test_coupling.py`` fails, naming the
member and our site, as soon as an installed verl's source of any of them differs, and fails when an
envace class overrides or calls a verl member that is not listed here (it scans the classes).

:func:`check_verl_version` (called by :mod:`envace.train.verl_ext.register`, i.e. in every process that loads
the extension) refuses any verl but :data:`PINNED_VERL`. vLLM's CPU shims have their own guard
(:data:`envace.train.verl_ext.cpu.PINNED`).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Literal

from envace.train.verl_ext.cpu import check_versions

__all__ = ["PINNED_VERL", "Coupling", "COUPLINGS", "check_verl_version", "resolve", "source_sha256",
           "drifted"]

PINNED_VERL = "0.9.1"

_BASE = "verl.trainer.ppo.v1.trainer_base:PPOTrainer"
_SHARED = "envace.train.verl_ext.trainer:EnvaceTrainer"
_PER_ROLE = "envace.train.verl_ext.per_role_trainer:PerRoleTrainer"
_SYNC = "envace.train.verl_ext.weight_sync"


@dataclass(frozen=True)
class Coupling:
    """One verl member envace depends on.

    ``how``: ``override`` (our subclass replaces it, calling it through ``super()`` unless ``note`` says
    otherwise), ``calls`` (a private member we call), ``reimplements`` (our code follows its steps
    without calling it: a change there may need the same change here), ``relies_on`` (we depend on its
    behaviour, e.g. the fields it reads). ``site``: where in envace (``module:qualname``).
    """

    target: str
    how: Literal["override", "calls", "reimplements", "relies_on"]
    site: str
    sha256: str
    note: str = ""


COUPLINGS: tuple[Coupling, ...] = (
    # --- the shared-policy trainer mode envace_sync (envace.train.verl_ext.trainer) ---
    Coupling(f"{_BASE}.__init__", "override", f"{_SHARED}.__init__", "6f938d77859b66ae"),
    Coupling(f"{_BASE}._balance_batch", "override", f"{_SHARED}._balance_batch", "f9b6e887d7504a65",
             "the authors' padding by copies first (batch_padding copy), then verl's own"),
    Coupling(f"{_BASE}._add_prompts_to_generate", "override", f"{_SHARED}._add_prompts_to_generate",
             "93543f843e1a1966",
             "counted per step (group filtering's refills); at the bound it unsets the buffer's metric"),
    Coupling("verl.trainer.ppo.v1.replay_buffer:ReplayBuffer.sample", "relies_on",
             f"{_SHARED}._add_prompts_to_generate", "cdcecebeb7f0b44e",
             "group filtering draws every replacement through the trainer's refill_fn, without a bound"),
    Coupling("verl.trainer.ppo.v1.replay_buffer:ReplayBuffer._dapo_filtered_keys", "relies_on",
             f"{_SHARED}._add_prompts_to_generate", "790dfb4e7ffb4d1b",
             "reads filter_groups_metric at every poll: None filters nothing (the step's refill bound)"),
    Coupling(f"{_BASE}._build_replay_buffer", "override", f"{_SHARED}._build_replay_buffer",
             "c6c5bd0783311ea3", "verl's own, its filter_groups_metric kept to restore after a bounded step"),
    Coupling(f"{_BASE}._compute_advantage", "override", f"{_SHARED}._compute_advantage", "2a4a2aa4a475b228"),
    Coupling(f"{_BASE}._compute_old_log_prob", "override", f"{_SHARED}._compute_old_log_prob",
             "b2630e6178ed99f7"),
    Coupling(f"{_BASE}._save_checkpoint", "override", f"{_SHARED}._save_checkpoint", "8c2435b577e54f19",
             "deferred until the step's metrics are logged, then verl's own save"),
    Coupling(f"{_BASE}._update_actor", "override", f"{_SHARED}._update_actor", "d7009bd8a69d40b9"),
    Coupling(f"{_BASE}.step", "override", f"{_SHARED}.step", "e22f53aadb7805d2"),
    # --- the per-role trainer mode envace_per_role_sync (envace.train.verl_ext.per_role_trainer, .per_role)
    # ---
    Coupling(f"{_BASE}._init_resource_pool_mgr", "override", f"{_PER_ROLE}._init_resource_pool_mgr",
             "9eaa3bab711e4deb"),
    Coupling(f"{_BASE}._load_checkpoint", "override", f"{_PER_ROLE}._load_checkpoint", "bb446d77c48ac6cc"),
    Coupling(f"{_BASE}._load_checkpoint", "reimplements", "envace.train.verl_ext.per_role:resume_step_dir",
             "bb446d77c48ac6cc", "which step to resume from, for the REHEARSE policy"),
    Coupling(f"{_BASE}._rollout_server_managers", "override", f"{_PER_ROLE}._rollout_server_managers",
             "dd7d42d6926c93f7"),
    Coupling(f"{_BASE}._setup", "override", f"{_PER_ROLE}._setup", "248aee497276b816"),
    Coupling(f"{_BASE}._step_once", "reimplements", f"{_PER_ROLE}._step_once", "efdd4abe161c6dee",
             "verl's stages (sample, reward, old/ref log-prob, advantage, update) once per role: verl's step "
             "has no hook between the advantage and the update to split the batch by policy"),
    Coupling(f"{_BASE}.get_llm_client", "override", f"{_PER_ROLE}.get_llm_client", "7e11f82fc42a93df",
             "returns a client routing each role to its policy's servers (no super() call)"),
    Coupling(f"{_BASE}._compute_ref_log_prob", "calls", f"{_PER_ROLE}._step_once", "f4d69ef51b12c284"),
    Coupling(f"{_BASE}._compute_reward_colocate", "calls", f"{_PER_ROLE}._step_once", "f0092bcdfbd5baf7"),
    Coupling(f"{_BASE}.on_sample_begin", "calls", f"{_PER_ROLE}._step_once", "1a3689b13fa4bd54"),
    Coupling("verl.trainer.ppo.v1.trainer_sync:PPOTrainerSync.on_sample_end", "calls",
             f"{_PER_ROLE}._step_once", "16f25f1081e0fddc"),
    Coupling("verl.workers.engine_workers:ActorRolloutRefWorker.init_model", "override",
             "envace.train.verl_ext.per_role_trainer:OwnServerActorRolloutRefWorker.init_model",
             "d1598903d82449f2"),
    Coupling("verl.workers.rollout.llm_server:LLMServerManager._initialize_llm_servers", "override",
             "envace.train.verl_ext.per_role_trainer:PolicyServerManager._initialize_llm_servers",
             "c862f5411a8828a8"),
    # --- weight-sync sockets named per Ray cluster (envace.train.verl_ext.weight_sync, registered by name in
    # envace.train.verl_ext.register) ---
    Coupling("verl.workers.rollout.vllm_rollout.vllm_rollout:ServerAdapter.__init__", "override",
             f"{_SYNC}:EnvaceServerAdapter.__init__", "b0daa53f7524e408",
             "renames self.zmq_handle, built from the Ray job id (line 141)"),
    Coupling("verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer.__init__", "override",
             f"{_SYNC}:EnvaceHttpServer.__init__", "e2513f96827ff4c3",
             "re-sets VERL_RAY_JOB_ID (line 143) before launch_server starts the vLLM workers"),
    Coupling("verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMReplica.__init__", "override",
             f"{_SYNC}:EnvaceReplica.__init__", "a43756da3be14482", "replaces server_class"),
    Coupling("verl.workers.rollout.vllm_rollout.utils:vLLMColocateWorkerExtension._get_zmq_handle",
             "relies_on", f"{_SYNC}:EnvaceHttpServer.__init__", "b823b8e182a4ba01",
             "the receiver's socket is named from $VERL_RAY_JOB_ID, the sender's format"),
    Coupling("verl.workers.rollout.base:get_rollout_class", "relies_on", "envace.train.verl_ext.register",
             "d0be5827f1214f04", "reads the private _ROLLOUT_REGISTRY, where envace's adapter is named"),
    # --- the agent loop envace_rehearsal (envace.train.verl_ext.agent_loop) ---
    Coupling("verl.experimental.agent_loop.agent_loop:AgentLoopBase.__init__", "override",
             "envace.train.verl_ext.agent_loop:EnvaceAgentLoop.__init__", "8d0c1cd056eaeeec"),
    Coupling("verl.trainer.ppo.v1.agent_loop_tq:AgentLoopWorkerTQ._agent_loop_postprocess", "relies_on",
             "envace.train.verl_ext.agent_loop:EnvaceAgentLoop.run", "523edacbff73640d",
             "it stores a list of AgentLoopOutput as separate training rows and copies extra fields"),
)


def check_verl_version() -> str:
    """The installed verl version; :class:`envace.train.verl_ext.cpu.UnsupportedVersion` unless it is
    :data:`PINNED_VERL` (the version every :class:`Coupling` was checked against)."""
    return check_versions(("verl",))["verl"]


def resolve(target: str) -> Any:
    """The object named ``module:qualname``."""
    module, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def source_sha256(target: str) -> str:
    """First 16 hex digits of the SHA-256 of ``target``'s source (``inspect.getsource``)."""
    obj = resolve(target)
    obj = obj.fget if isinstance(obj, property) else obj
    return hashlib.sha256(inspect.getsource(obj).encode("utf-8")).hexdigest()[:16]


def drifted(couplings: tuple[Coupling, ...] = COUPLINGS) -> list[str]:
    """One message per coupling whose verl member changed (or is gone) since it was checked."""
    out = []
    for c in couplings:
        try:
            now = source_sha256(c.target)
        except (AttributeError, ImportError, OSError, TypeError) as exc:
            out.append(f"{c.target} ({c.how} by {c.site}) cannot be read: {exc}")
            continue
        if now != c.sha256:
            out.append(f"{c.target} ({c.how} by {c.site}) changed: source sha256 {now} != {c.sha256} "
                       f"(checked against verl {PINNED_VERL}); re-read it and update envace before its hash")
    return out
