"""The single-process CPU trainer for smoke scale (not a second RL framework).

Implemented, per step ``s`` (1-based):

1. **Batch**: ``prompts_per_step`` examples, a seeded permutation per epoch (depends only on
   ``(seed, s)``, so a resumed run sees the same batches).
2. **Rollouts**: ``rollouts_per_prompt`` trajectories per example through :func:`envace.rollout.run_rollout`
   with :class:`envace.tiny_model.HFGenerateBackend` backends seeded by ``(seed, s, prompt, rollout)``.
   Modes: ``envace`` + ``shared`` = ``rehearsal`` (one model plays ACT and REHEARSE); ``envace`` +
   ``per_role`` = two models, the ACT model acting and the REHEARSE model answering (run as
   ``external_simulator`` so the two contexts use different weights; both models' rows are trained);
   ``grpo`` = ``external_simulator`` with a frozen simulator model, only ACT rows trainable.
3. **Reward**: a callable ``(messages, example) -> RewardResult`` (:mod:`envace.reward`); a ``None``
   reward (judge failure under ``drop_sample``) drops the trajectory's rows.
4. **Advantages**: :func:`envace.advantage.role_wise_grpo` over all rows of the step, uid = the prompt's
   batch slot (one group per drawn prompt), role = row role (standard GRPO is the same call with only
   ACT rows); broadcast over response tokens.
5. **Update**: per trained model, old log-probs = the detached log-probs of the update's own forward pass
   (identical to verl's recomputation because there is one optimizer step per batch; the gap to the
   rollout's log-probs is logged), then verl's own ``core_algos.compute_policy_loss_vanilla`` (clip
   ``clip_ratio``, dual-clip ``dual_clip``) with ``agg_loss``'s global token count so micro-batches sum to
   one ``loss_agg_mode`` aggregate; KL (``core_algos.kl_penalty`` + ``agg_loss`` against a frozen copy of
   the initial weights) when ``kl.use_kl_loss``; entropy bonus via verl's ``entropy_from_logits`` when
   ``entropy_coef > 0``. AdamW, gradient clipping at ``grad_clip``, one optimizer step per batch (a step
   with a non-finite gradient norm is skipped, as in verl).
6. **Metrics** (one JSON line per step in ``metrics.jsonl``): reward stats, dropped samples, advantage
   stats, loss and pg metrics per model, grad norm, token counts, termination reasons, rollout/trainer
   log-prob gap, judge counters, wall time.
7. **Checkpoints** every ``save_every`` steps and at the end: ``global_step_{s}/`` holding, per model,
   ``<actor|rehearse>/huggingface`` (``save_pretrained`` weights + tokenizer) and ``optim.pt``, plus
   ``trainer_state.pt`` (step, RNG states); written to a temp directory, renamed, then
   ``latest_checkpointed_iteration.txt`` (verl's tracker name) is replaced atomically; the newest
   ``keep_checkpoints`` (>= 2) are kept. A new trainer on the same directory resumes from the tracker;
   metrics lines after the resumed step are discarded.

Warm start (ours, configurable): before step 1 of a fresh run, ``warmstart_steps`` SFT
steps (cross-entropy, its own AdamW) on each example's reference first-turn tool calls (ACT rows:
initial prompt -> ``<tool_call>`` blocks), and with ``warmstart_rehearse`` also on the reference
call/response pairs (REHEARSE rows: rehearsal prompt -> ``<execution_result>`` block), so the tiny model
emits parseable calls and rewards are not all zero. Simplification: the reference final answers are not
part of the warm start. The warm start runs before the first checkpoint, so a resumed run never repeats
it.

Verified on CPU (tests/train): 3 steps change parameters with a finite loss; kill + resume gives the same
next-step loss as an uninterrupted run; per-role updates only the model of each row's role.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envace.advantage import role_wise_grpo
from envace.data import TrainingExample
from envace.rehearsal import CallCandidate, RehearsalContext, RehearsalPrompt, ToolRegistry
from envace.reward import RewardResult
from envace.rollout import GenerateBackend, Mode, RolloutConfig, Trajectory, run_rollout
from envace.tiny_model import HFGenerateBackend
from envace.tools import ChatTokens, ToolCall, render_tool_call
from envace.warmstart import sft

__all__ = ["TrainerSettings", "CpuTrainer", "TRACKER", "latest_step"]

TRACKER = "latest_checkpointed_iteration.txt"  # verl's tracker file name
RewardFn = Callable[[list[dict[str, Any]], TrainingExample], RewardResult]
#: ``(role, model, seed) -> GenerateBackend``; role is "act", "rehearse" (per-role) or "simulator" (grpo)
BackendFactory = Callable[[str, torch.nn.Module, int], GenerateBackend]


@dataclass
class TrainerSettings:
    """Everything the CPU trainer reads; :meth:`from_config` maps a ``training.runs`` entry onto it."""

    run: str = "run"
    algorithm: str = "envace"
    roles: str = "shared"
    total_steps: int = 4
    lr: float = 1e-4
    prompts_per_step: int = 2
    rollouts_per_prompt: int = 2
    max_prompt_tokens: int = 1024
    max_response_tokens: int = 512
    max_turns: int = 4
    clip_ratio: float = 0.2
    dual_clip: float = 3.0
    loss_agg_mode: str = "token-mean"
    entropy_coef: float = 0.0
    use_kl_loss: bool = False
    kl_coef: float = 1e-4
    kl_loss_type: str = "low_var_kl"  # verl's default
    rollout_temperature: float = 1.0
    save_every: int = 2
    precheck: str = "none"
    seed: int = 0
    grad_clip: float = 1.0  # verl's default actor grad_clip
    micro_batch_rows: int = 8
    keep_checkpoints: int = 2
    rehearse_max_tokens: int | None = None  # default: max_response_tokens
    warmstart_steps: int = 0
    warmstart_lr: float = 3e-3
    warmstart_rehearse: bool = False  # also SFT the REHEARSE role on reference pairs (long prompts: slow)
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.algorithm not in ("envace", "grpo"):
            raise ValueError(f"algorithm must be envace or grpo, got {self.algorithm!r}")
        if self.roles not in ("shared", "per_role"):
            raise ValueError(f"roles must be shared or per_role, got {self.roles!r}")
        if self.algorithm == "grpo" and self.roles != "shared":
            raise ValueError("algorithm grpo trains only ACT: roles must be shared")
        self.keep_checkpoints = max(2, self.keep_checkpoints)

    @classmethod
    def from_config(cls, cfg: dict[str, Any], run: str) -> TrainerSettings:
        """Settings of ``training.runs[run]`` plus the optional ``training.cpu_trainer`` block."""
        runs = cfg["training"]["runs"]
        if run not in runs:
            raise ValueError(f"unknown run {run!r}; training.runs has {sorted(runs)}")
        r = runs[run]
        extra = dict(cfg["training"].get("cpu_trainer") or {})
        return cls(
            run=run, algorithm=r["algorithm"], roles=r["roles"], total_steps=r["total_steps"], lr=r["lr"],
            prompts_per_step=r["prompts_per_step"], rollouts_per_prompt=r["rollouts_per_prompt"],
            max_prompt_tokens=r["max_prompt_tokens"], max_response_tokens=r["max_response_tokens"],
            max_turns=r["max_turns"], clip_ratio=r["clip_ratio"], dual_clip=r["dual_clip"],
            loss_agg_mode=r["loss_agg_mode"], entropy_coef=r["entropy_coef"],
            use_kl_loss=r["kl"]["use_kl_loss"], kl_coef=r["kl"]["coef"],
            rollout_temperature=r["rollout_temperature"], save_every=r["save_every"],
            precheck=r.get("precheck", "none"), **extra,
        )

    @property
    def model_keys(self) -> list[str]:
        """Trained models: ``["actor"]`` or ``["actor", "rehearse"]`` (per-role)."""
        return ["actor", "rehearse"] if self.roles == "per_role" else ["actor"]

    def rollout_config(self) -> RolloutConfig:
        mode = Mode.REHEARSAL if (self.algorithm == "envace" and self.roles == "shared") \
            else Mode.EXTERNAL_SIMULATOR
        return RolloutConfig(
            mode=mode, max_turns=self.max_turns, max_prompt_tokens=self.max_prompt_tokens,
            max_response_tokens=self.max_response_tokens,
            max_rehearse_context_tokens=self.max_prompt_tokens + self.max_response_tokens,
            act_sampling={"temperature": self.rollout_temperature, "max_tokens": self.max_response_tokens},
            rehearse_sampling={"temperature": self.rollout_temperature,
                               "max_tokens": self.rehearse_max_tokens or self.max_response_tokens},
            precheck=self.precheck,  # type: ignore[arg-type]
            template_kwargs=dict(self.template_kwargs),
        )


@dataclass
class _Row:
    """One training row: ``ids`` = prompt + response, shape ``(prompt_len + T,)``."""

    model: str
    role: str
    uid: str
    ids: list[int]
    prompt_len: int
    rollout_logprobs: list[float]
    reward: float
    advantage: float = 0.0

    @property
    def response_len(self) -> int:
        return len(self.ids) - self.prompt_len


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def latest_step(checkpoint_dir: str | Path) -> int:
    """The step in the tracker file (0 if there is none)."""
    tracker = Path(checkpoint_dir) / TRACKER
    if not tracker.is_file():
        return 0
    return int(tracker.read_text().strip())


def _stats(values: list[float], prefix: str) -> dict[str, float]:
    if not values:
        return {}
    arr = np.asarray(values, dtype=np.float64)
    return {f"{prefix}/mean": float(arr.mean()), f"{prefix}/std": float(arr.std()),
            f"{prefix}/min": float(arr.min()), f"{prefix}/max": float(arr.max())}


class CpuTrainer:
    """Train one run on CPU.

    Args:
        settings: :class:`TrainerSettings`.
        examples: the training examples (:func:`envace.data.read_training_parquet`).
        tokenizer: the policy tokenizer (chat template; eos = turn end).
        model: the initial policy (``per_role``: copied for the REHEARSE model).
        reward_fn: ``(messages, example) -> RewardResult``.
        checkpoint_dir: checkpoints and ``metrics.jsonl``.
        simulator: frozen simulator model for ``grpo`` (same tokenizer).
        log: progress lines.
        backend_factory: builds the generate backends (default :class:`HFGenerateBackend`; tests script
            the ACT role with it).
    """

    def __init__(self, settings: TrainerSettings, examples: list[TrainingExample], tokenizer: Any,
                 model: torch.nn.Module, reward_fn: RewardFn, checkpoint_dir: str | Path,
                 simulator: torch.nn.Module | None = None, log: Callable[[str], None] = print,
                 backend_factory: BackendFactory | None = None) -> None:
        if not examples:
            raise ValueError("no training examples")
        if settings.algorithm == "grpo" and simulator is None:
            raise ValueError("algorithm grpo needs a simulator model")
        self.s = settings
        self.examples = examples
        self.tokenizer = tokenizer
        self.reward_fn = reward_fn
        self.dir = Path(checkpoint_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.models: dict[str, torch.nn.Module] = {"actor": model}
        if settings.roles == "per_role":
            self.models["rehearse"] = copy.deepcopy(model)
        self.simulator = simulator
        self.backend_factory = backend_factory or (
            lambda _role, model, seed: HFGenerateBackend(model, self.eos_ids, seed=seed))
        self.refs = {k: self._frozen(m) for k, m in self.models.items()} if settings.use_kl_loss else {}
        self.optims = {k: torch.optim.AdamW(m.parameters(), lr=settings.lr) for k, m in self.models.items()}
        eos = {tokenizer.eos_token_id, tokenizer.pad_token_id} - {None}
        self.eos_ids = sorted(int(i) for i in eos)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else tokenizer.eos_token_id)
        from verl.workers.config import ActorConfig

        self.actor_config = ActorConfig(
            strategy="fsdp", clip_ratio=settings.clip_ratio, clip_ratio_c=settings.dual_clip,
            loss_agg_mode=settings.loss_agg_mode, ppo_micro_batch_size_per_gpu=settings.micro_batch_rows,
            rollout_n=settings.rollouts_per_prompt, use_kl_loss=settings.use_kl_loss,
            kl_loss_coef=settings.kl_coef, kl_loss_type=settings.kl_loss_type,
            entropy_coeff=settings.entropy_coef,
        )
        self.step_done = 0
        self.resumed_from = self._resume()

    @staticmethod
    def _frozen(model: torch.nn.Module) -> torch.nn.Module:
        ref = copy.deepcopy(model)
        ref.eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    # ----------------------------------------------------------------------------------- checkpoints
    def _resume(self) -> int:
        step = latest_step(self.dir)
        if step == 0:
            return 0
        ckpt = self.dir / f"global_step_{step}"
        for key, model in self.models.items():
            loaded = type(model).from_pretrained(ckpt / key / "huggingface")
            model.load_state_dict(loaded.state_dict())
            self.optims[key].load_state_dict(torch.load(ckpt / key / "optim.pt", weights_only=False))
        state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
        torch.set_rng_state(state["torch_rng"])
        np.random.set_state(state["numpy_rng"])
        random.setstate(state["python_rng"])
        if state["step"] != step:
            raise RuntimeError(f"checkpoint {ckpt} holds step {state['step']}, tracker says {step}")
        self.step_done = step
        metrics = self.dir / "metrics.jsonl"
        if metrics.is_file():  # drop lines of steps that ran after this checkpoint (and a torn last line)
            keep = []
            for ln in metrics.read_text().splitlines():
                try:
                    if ln and json.loads(ln)["step"] <= step:
                        keep.append(ln)
                except (ValueError, KeyError):
                    break  # a line cut by a kill mid-write: nothing after it is trustworthy
            metrics.write_text("".join(ln + "\n" for ln in keep))
        self.log(f"resumed {self.s.run} from {ckpt}")
        return step

    def save(self, step: int) -> Path:
        """Write ``global_step_{step}`` atomically, update the tracker, prune old checkpoints."""
        final = self.dir / f"global_step_{step}"
        tmp = self.dir / f".tmp_global_step_{step}"
        shutil.rmtree(tmp, ignore_errors=True)
        for key, model in self.models.items():
            model.save_pretrained(tmp / key / "huggingface")
            self.tokenizer.save_pretrained(tmp / key / "huggingface")
            torch.save(self.optims[key].state_dict(), tmp / key / "optim.pt")
        torch.save({"step": step, "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(),
                    "python_rng": random.getstate(), "run": self.s.run}, tmp / "trainer_state.pt")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        tracker_tmp = self.dir / f".{TRACKER}.tmp"
        tracker_tmp.write_text(str(step))
        os.replace(tracker_tmp, self.dir / TRACKER)
        steps = sorted(int(p.name.rsplit("_", 1)[1]) for p in self.dir.glob("global_step_*"))
        for old in steps[: -self.s.keep_checkpoints]:
            shutil.rmtree(self.dir / f"global_step_{old}", ignore_errors=True)
        return final

    # -------------------------------------------------------------------------------------- rollouts
    def batch_indices(self, step: int) -> list[int]:
        """Example indices of ``step`` (a seeded permutation per epoch)."""
        n, p = len(self.examples), self.s.prompts_per_step
        out = []
        for j in range(p):
            g = (step - 1) * p + j
            perm = np.random.default_rng([self.s.seed, g // n]).permutation(n)
            out.append(int(perm[g % n]))
        return out

    async def _rollouts(self, step: int) -> list[tuple[int, TrainingExample, Trajectory]]:
        cfg = self.s.rollout_config()
        out = []
        for p, idx in enumerate(self.batch_indices(step)):
            ex = self.examples[idx]
            for k in range(self.s.rollouts_per_prompt):
                seed = _seed(self.s.seed, step, p, k)
                policy = self.backend_factory("act", self.models["actor"], seed)
                responder = None
                if self.s.roles == "per_role":
                    responder = self.backend_factory("rehearse", self.models["rehearse"], seed + 1)
                elif self.s.algorithm == "grpo":
                    assert self.simulator is not None
                    responder = self.backend_factory("simulator", self.simulator, seed + 1)
                traj = await run_rollout(policy, self.tokenizer, ex.prompt, ex.tools, cfg,
                                         simulator=responder, references=ex.references)
                out.append((p, ex, traj))
        return out

    def _rows(self, rollouts: list[tuple[int, TrainingExample, Trajectory]], rewards: list[float | None]
              ) -> list[_Row]:
        rows = []
        for (slot, ex, traj), reward in zip(rollouts, rewards, strict=True):
            if reward is None:
                continue
            for gen in traj.generations:
                if not gen.response_ids:
                    continue
                if self.s.roles == "per_role":
                    key = "actor" if gen.role == "act" else "rehearse"
                elif gen.trainable:
                    key = "actor"
                else:
                    continue
                ids = gen.context[: gen.prompt_len] + list(gen.response_ids)
                # group key: the batch slot (an example drawn twice in one step forms two groups)
                rows.append(_Row(key, gen.role, f"{slot}:{ex.uid}", ids, gen.prompt_len, list(gen.logprobs),
                                 float(reward)))
        if rows:
            adv = role_wise_grpo([r.uid for r in rows], [r.role for r in rows], [r.reward for r in rows])
            for row, a in zip(rows, adv, strict=True):
                row.advantage = float(a)
        return rows

    # ---------------------------------------------------------------------------------------- update
    def _forward(self, model: torch.nn.Module, rows: list[_Row], with_logits: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Response log-probs ``(B, T)``, response mask ``(B, T)`` and (optionally) response logits
        ``(B, T, V)`` of ``rows`` under ``model`` (logits divided by the rollout temperature)."""
        length = max(len(r.ids) for r in rows)
        t_max = max(r.response_len for r in rows)
        ids = torch.full((len(rows), length), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(rows), length), dtype=torch.long)
        for b, r in enumerate(rows):
            ids[b, : len(r.ids)] = torch.tensor(r.ids)
            attn[b, : len(r.ids)] = 1
        logits = model(input_ids=ids, attention_mask=attn).logits.float() / self.s.rollout_temperature
        start = torch.tensor([r.prompt_len - 1 for r in rows]).unsqueeze(1)  # logit index of 1st response
        pos = (start + torch.arange(t_max).unsqueeze(0)).clamp(max=length - 2)  # (B, T)
        mask = (torch.arange(t_max).unsqueeze(0) < torch.tensor([r.response_len for r in rows]).unsqueeze(1))
        resp_logits = torch.gather(logits, 1, pos.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))  # (B,T,V)
        targets = torch.gather(ids, 1, pos + 1)  # (B, T)
        logp = torch.gather(torch.log_softmax(resp_logits, -1), 2, targets.unsqueeze(-1)).squeeze(-1)
        return logp, mask.float(), resp_logits if with_logits else None

    def _update(self, key: str, rows: list[_Row]) -> dict[str, float]:
        from verl.trainer.ppo import core_algos
        from verl.utils.torch_functional import entropy_from_logits

        model, optim = self.models[key], self.optims[key]
        mb = self.s.micro_batch_rows
        chunks = [rows[i: i + mb] for i in range(0, len(rows), mb)]
        n_tokens = sum(r.response_len for r in rows)
        # verl's config is frozen but its global_batch_info dict is filled per batch by the trainer
        self.actor_config.global_batch_info.update(dp_size=1, batch_num_tokens=n_tokens,
                                                   global_batch_size=len(rows))
        model.eval()  # no dropout: old and new log-probs come from the same function
        with torch.no_grad():
            refs = [self._forward(self.refs[key], c)[0] for c in chunks] if self.s.use_kl_loss else []
        metrics: dict[str, float] = Counter()
        gap = 0.0
        optim.zero_grad(set_to_none=True)
        for i, c in enumerate(chunks):
            logp, mask, logits = self._forward(model, c, with_logits=self.s.entropy_coef > 0)
            # One optimizer step per batch: the policy has not changed since the rollout, so verl's
            # recomputed old log-probs equal this forward's values; detaching them saves a second pass.
            old = logp.detach()
            rollout = torch.tensor(_pad([r.rollout_logprobs for r in c]))
            gap = max(gap, float(((old - rollout).abs() * mask).max()))
            adv = torch.tensor([r.advantage for r in c], dtype=torch.float32).unsqueeze(1) * mask
            pg_loss, pg_metrics = core_algos.compute_policy_loss_vanilla(
                old, logp, adv, mask, self.s.loss_agg_mode, self.actor_config)
            loss = pg_loss
            share = float(mask.sum()) / n_tokens
            metrics["pg_loss"] += float(pg_loss.detach())
            for name, value in pg_metrics.items():
                metrics[name.split("/")[-1]] += float(value) * share
            if self.s.use_kl_loss:
                kl = core_algos.kl_penalty(logp, refs[i], self.s.kl_loss_type)
                kl_loss = core_algos.agg_loss(kl, mask, self.s.loss_agg_mode,
                                              **self.actor_config.global_batch_info)
                loss = loss + self.s.kl_coef * kl_loss
                metrics["kl_loss"] += float(kl_loss.detach())
            if self.s.entropy_coef > 0:
                assert logits is not None
                ent = core_algos.agg_loss(entropy_from_logits(logits), mask, self.s.loss_agg_mode,
                                          **self.actor_config.global_batch_info)
                loss = loss - self.s.entropy_coef * ent
                metrics["entropy"] += float(ent.detach())
            metrics["loss"] += float(loss.detach())
            loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), self.s.grad_clip))
        if math.isfinite(grad_norm):
            optim.step()
        else:
            self.log(f"step skipped for {key}: grad norm {grad_norm}")
        optim.zero_grad(set_to_none=True)
        out = {f"{key}/{k}": float(v) for k, v in metrics.items()}
        out[f"{key}/grad_norm"] = grad_norm
        out[f"{key}/rows"] = float(len(rows))
        out[f"{key}/response_tokens"] = float(n_tokens)
        out[f"{key}/rollout_logprob_gap_max"] = gap
        return out

    # ------------------------------------------------------------------------------------- warm start
    def warm_start(self) -> list[float]:
        """SFT on the reference calls (see the module docstring); returns the loss per SFT step."""
        seqs: dict[str, list[tuple[list[int], int]]] = {k: [] for k in self.models}
        prompt = RehearsalPrompt(self.s.rollout_config().prompt_name)
        eos = self.tokenizer.eos_token_id
        for ex in self.examples:
            act = ChatTokens(self.tokenizer, ex.prompt, ex.tools, template_kwargs=self.s.template_kwargs)
            calls = [ToolCall(c["name"], c["arguments"]) for c in ex.reference_calls]
            if calls:
                text = "\n".join(render_tool_call(c) for c in calls)
                target = self.tokenizer.encode(text, add_special_tokens=False) + [eos]
                seqs["actor"].append((list(act.ids) + target, len(act.ids)))
            if self.s.algorithm == "grpo" or not self.s.warmstart_rehearse:
                continue
            for ref in ex.references[: len(calls)]:
                call = ToolCall(ref["call"]["name"], ref["call"]["arguments"])
                ctx = RehearsalContext(self.tokenizer, prompt, ToolRegistry(ex.tools), list(ex.prompt),
                                       list(ex.references), dict(self.s.template_kwargs))
                ids = list(ctx.prompt_ids(CallCandidate(call, render_tool_call(call))))
                body = json.dumps(ref["response"], ensure_ascii=False)
                reply = f"<execution_result>{body}</execution_result>"
                target = self.tokenizer.encode(reply, add_special_tokens=False) + [eos]
                seqs["rehearse" if self.s.roles == "per_role" else "actor"].append((ids + target, len(ids)))
        per_model = [sft(self.models[key], items, self.s.warmstart_steps, self.s.warmstart_lr, self.pad_id,
                         self.s.micro_batch_rows, self.s.grad_clip)
                     for key, items in seqs.items() if items]
        return [sum(step) for step in zip(*per_model, strict=True)]

    # ------------------------------------------------------------------------------------------ loop
    def train_step(self, step: int) -> dict[str, Any]:
        """Run one step (rollouts, rewards, advantages, update); returns its metrics."""
        t0 = time.perf_counter()
        for m in self.models.values():
            m.eval()
        rollouts = asyncio.run(self._rollouts(step))
        t_roll = time.perf_counter() - t0
        results = [self.reward_fn(traj.messages, ex) for _p, ex, traj in rollouts]
        rewards = [r.reward for r in results]
        rows = self._rows(rollouts, rewards)
        metrics: dict[str, Any] = {"step": step, "run": self.s.run}
        kept = [r for r in rewards if r is not None]
        metrics.update(_stats(kept, "reward"))
        metrics["reward/dropped"] = sum(r is None for r in rewards)
        metrics.update(_stats([r.advantage for r in rows], "advantage"))
        metrics["rows/act"] = sum(r.role == "act" for r in rows)
        metrics["rows/rehearse"] = sum(r.role == "rehearse" for r in rows)
        metrics["termination"] = dict(Counter(str(t.termination) for _p, _e, t in rollouts))
        metrics["turns/mean"] = float(np.mean([t.num_turns for _p, _e, t in rollouts]))
        metrics["tokens/generated"] = sum(len(g.response_ids) for _p, _e, t in rollouts
                                          for g in t.generations)
        for key in self.s.model_keys:
            mine = [r for r in rows if r.model == key]
            if mine:
                metrics.update(self._update(key, mine))
        metrics["time/rollout_s"] = t_roll
        metrics["time/step_s"] = time.perf_counter() - t0
        return metrics

    def train(self, until: int | None = None, judge_metrics: Callable[[], dict[str, int]] | None = None
              ) -> dict[str, Any]:
        """Train from the resumed step to ``until`` (default ``total_steps``); returns a summary."""
        until = self.s.total_steps if until is None else min(until, self.s.total_steps)
        start = self.step_done
        t0 = time.perf_counter()
        warm: list[float] = []
        if start == 0 and self.s.warmstart_steps > 0:
            warm = self.warm_start()
            self.log(f"warm start: {len(warm)} SFT steps, loss {warm[0]:.3f} -> {warm[-1]:.3f}")
        last: dict[str, Any] = {}
        for step in range(start + 1, until + 1):
            last = self.train_step(step)
            if judge_metrics is not None:
                last["judge"] = judge_metrics()
            with open(self.dir / "metrics.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(last) + "\n")
            self.step_done = step
            self.log(f"step {step}/{self.s.total_steps}: reward {last.get('reward/mean', float('nan')):.3f} "
                     f"loss {last.get('actor/loss', float('nan')):.4f}")
            if step % self.s.save_every == 0 or step == until:
                self.save(step)
        if self.step_done < until:
            raise RuntimeError(f"training stopped at step {self.step_done}, expected {until}")
        wall = time.perf_counter() - t0
        ran = self.step_done - start
        return {"run": self.s.run, "start_step": start, "final_step": self.step_done, "steps_run": ran,
                "wall_s": wall, "steps_per_s": ran / wall if ran and wall > 0 else None,
                "warmstart_losses": warm, "last_metrics": last,
                "checkpoint": str(self.dir / f"global_step_{self.step_done}") if self.step_done else None}


def _pad(rows: list[list[float]]) -> list[list[float]]:
    width = max(len(r) for r in rows)
    return [r + [0.0] * (width - len(r)) for r in rows]
