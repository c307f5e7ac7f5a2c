"""A narrow subclass of verl 0.9.1's v1 sync trainer (``trainer.v1.trainer_mode=envace_sync``).

Implemented (runs wherever verl's main_ppo runs: GPUs, or this CPU through :mod:`envace.train.verl_ext.cpu`):

- :meth:`EnvaceTrainer._compute_advantage`: before verl's own advantage step, rewrite each row's ``uid``
  in TransferQueue to the role-aware id ``"<uid>::<role>"`` (role from the row's ``extra_fields``
  written by :mod:`envace.train.verl_ext.agent_loop`; the replay buffer's ``is_padding`` rows get a unique pad
  id), run verl's step with ``algorithm.adv_estimator=envace_role_wise``, then restore the prompt uids so
  metrics still group by prompt. Why: verl passes estimators only ``index`` (the uid), not the rows'
  other columns.
- Judge failures (:func:`judge_failure_stats`): each step logs ``envace/judge/*`` (failed verdicts, failed
  trajectories and their share, from the rows' ``reward_extra_info``) and stops with
  :class:`JudgeFailureError` when the share exceeds ``envace.max_judge_failure_share``: a judge server
  that died mid-training is never a silent reward of 0. ``envace train`` copies the per-step counts into
  its done-file.
- Episode endings (:func:`termination_stats`): each step logs ``envace/termination/<reason>``, the share
  of its trajectories that ended for each :class:`envace.core.rollout.Termination` reason.
- REHEARSE against the references (:func:`rehearse_reference_stats`): each step logs
  ``envace/rehearse/*``, how many calls a model answered, the share malformed, and how often the answer
  equals the example's reference response for the same call (exact JSON value; success/error kind):
  the REHEARSE role's training dynamics beside the reward's.
- :meth:`EnvaceTrainer._update_actor`: one optimizer step per batch (authors' script). verl sizes PPO
  mini-batches as ``ppo_mini_batch_size x rollout.n`` rows, which assumes one row per rollout; with one
  row per generation a step has many more rows, so the mini-batch is set to the whole (padded) batch for
  the duration of the call when ``envace.one_update_per_batch`` is true.

- :meth:`EnvaceTrainer._build_replay_buffer`: verl 0.9.1 switches its sync-only behaviour on the mode
  *name* (``trainer_mode == "sync"``: the sync replay buffer, the dataloader's ``gen_batch_size``, no
  TransferQueue state in checkpoints); a trainer registered under another name would silently get the
  async variants. The trainer therefore records ``trainer_mode = "sync"`` (its registered name stays
  ``envace_sync``) before verl builds the buffer.

- :meth:`EnvaceTrainer.step` + :func:`check_rollout_agreement`, the guard: after verl's step (before
  the checkpoint and the weight sync) each trained policy's rollout-vs-actor agreement (verl's
  ``training/rollout_actor_probs_pearson_corr``; here the shared policy on all rows and, through verl's
  own ``calculate_debug_metrics`` on each role's rows, ``envace/<role>/training/...``; ACT and REHEARSE
  in :mod:`envace.train.verl_ext.per_role_trainer`) is logged as ``envace/rollout_actor_corr/<name>`` and the
  run stops with :class:`RolloutAgreementError` when one is below ``envace.min_rollout_actor_corr``
  (``_envace_common.yaml``; 0 disables). Why: a rollout server that does not get its policy's weights
  trains on garbage without a word (the per-role REHEARSE server did: correlation 0.002). A correlation
  that is undefined (NaN: a policy deterministic on every sampled token, as a collapsing one becomes) is
  decided by the mean probability difference instead (``envace.max_rollout_actor_prob_diff``, logged as
  ``envace/rollout_actor_prob_diff/<name>``); counting NaN as low stopped a sign-flipped control run.

- :meth:`EnvaceTrainer._add_prompts_to_generate`, a bound on group filtering: with verl's own DAPO
  filtering (``algorithm.filter_groups``, ``training.runs.<run>.filter_groups``) the replay buffer replaces
  each group whose rewards were all equal by fresh prompts through this trainer method, with no bound in
  verl 0.9.1's v1 buffer (a policy whose rollouts became identical would generate for ever). Once a step
  has drawn ``envace.max_filter_refill_batches`` batches of replacements, the step stops filtering: the
  buffer's ``filter_groups_metric`` is unset until the step ends (its ``_dapo_filtered_keys`` reads it at
  every poll), so the groups still to finish are kept whatever their rewards and the step trains as an
  unfiltered one would, after about that many batches of replacements plus those still in flight. Each
  step logs ``envace/filter_groups/refilled_prompts`` and ``envace/filter_groups/capped`` (1: the bound
  was reached).

- :meth:`EnvaceTrainer._apply_row_penalties`: a row's own reward term. verl's v1 worker copies a
  trajectory's reward to all its rows (``agent_loop_tq.py`` ``_agent_loop_postprocess``); the authors
  then subtract 0.1 from each blank row (``apply_invalid_action_penalty``). The agent loop records
  each row's ``envace_row_penalty`` (``training.reward_rules.empty_response_penalty: per_row``), added
  here to the row's last-token reward in TransferQueue before verl's advantage step.
- :meth:`EnvaceTrainer._save_checkpoint`, checkpoint after metrics: verl's fit loop
  (``trainer/ppo/v1/trainer_base.py`` lines 481-514) saves step N's checkpoint, then syncs weights,
  validates and only then logs step N's metrics. A job killed in between (``scancel`` under Slurm, seen
  in CI) resumes at N+1 and step N's metrics are lost for good. The trainer therefore defers the save
  until verl's ``Tracking.log`` for step N has returned (``self.logger`` wraps verl's tracker, see
  :class:`_SaveAfterLog`); nothing changes the model, the optimizer or the dataloader between the two
  points, so the checkpoint is the same.

- :meth:`EnvaceTrainer._balance_batch`, the authors' batch padding (``envace.batch_padding: copy``):
  copies of the step's own rows up to a multiple of ``envace.padding_multiple``
  (:mod:`envace.train.verl_ext.padding`) before verl's balancing; ``mask`` leaves verl's masked padding.

Everything else (sampling, log-probs, checkpoints, resume, validation) is verl's.
Verified: the guard's decisions in tests/train/verl_ext/test_per_role_trainer.py; the whole trainer through
verl's real ``main_ppo`` on CPU in the smoke DAG (shared policy; the agreement it logs:
docs/measurements.md, "Numbers behind design choices in the code") and test_per_role_main_ppo.py (per-role
subclass, including the guard stopping an unsynced run); there the roles are read from TransferQueue's
``extra_fields`` as written by the agent loop (a row without a role is a clear error).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

from omegaconf import open_dict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from envace.core.fidelity import REFERENCE_COUNTS
from envace.train.verl_ext.advantage import role_group_ids
from envace.train.verl_ext.padding import pad_with_copies

__all__ = [
    "AGREEMENT_METRIC",
    "DEFAULT_MIN_AGREEMENT",
    "TRAINER_MODE",
    "EnvaceTrainer",
    "JudgeFailureError",
    "RolloutAgreementError",
    "check_judge_failures",
    "check_rollout_agreement",
    "prob_diffs",
    "refill_reaches_cap",
    "judge_failure_stats",
    "rehearse_reference_stats",
    "penalised_scores",
    "row_penalty_of",
    "row_role",
]

TRAINER_MODE = "envace_sync"
ROLES = ("act", "rehearse")

#: verl's rollout-vs-actor agreement (``utils/debug/metrics.py calculate_debug_metrics``, computed in the
#: old-log-prob pass when ``rollout.calculate_log_probs``): Pearson correlation of the token probabilities
#: the rollout server sampled with and the ones the trained policy assigns to the same tokens.
AGREEMENT_METRIC = "training/rollout_actor_probs_pearson_corr"
_VALID_METRIC = "training/rollout_probs_diff_valid"  # 0: the batch had no response token to compare
#: verl's mean |p_rollout - p_actor| over the same response tokens (same function as above).
DIFF_METRIC = "training/rollout_probs_diff_mean"
#: Used when ``envace.min_rollout_actor_corr`` / ``envace.max_rollout_actor_prob_diff`` are absent; the
#: sources are in _envace_common.yaml.
DEFAULT_MIN_AGREEMENT = 0.8
DEFAULT_MAX_PROB_DIFF = 0.05
DEFAULT_MAX_REFILL_BATCHES = 2


def refill_reaches_cap(refilled: int, cap: int) -> bool:
    """Whether a step that has drawn ``refilled`` replacement prompts (group filtering) has reached the
    bound ``cap`` (0: no bound): from then on the step keeps every group."""
    return cap > 0 and refilled >= cap


class RolloutAgreementError(RuntimeError):
    """A policy's rollout server does not serve that policy's weights (agreement below the floor)."""


def prob_diffs(metrics: Mapping[str, Any], policies: Mapping[str, str]) -> dict[str, float]:
    """Each measured policy's mean |p_rollout - p_actor| this step (``{policy: diff}``)."""
    keys = {policy: key.replace(AGREEMENT_METRIC, DIFF_METRIC) for policy, key in policies.items()}
    return {policy: float(metrics[key]) for policy, key in keys.items() if key in metrics}


def check_rollout_agreement(
    metrics: Mapping[str, Any], policies: Mapping[str, str], floor: float, step: int,
    max_prob_diff: float = DEFAULT_MAX_PROB_DIFF,
) -> dict[str, float]:
    """Each policy's agreement this step (``{policy: corr}``); :class:`RolloutAgreementError` below ``floor``.

    ``policies``: ``{policy name: metric key}``. A policy without the metric this step (no rows of its
    role) or whose batch had no response token is not measured. A NaN correlation is undefined, not low:
    one side's token probabilities are all equal (a policy that has become deterministic on every token it
    sampled, e.g. one collapsing under a negated advantage; or a single response token). The probabilities
    themselves then decide: the step agrees when their mean absolute difference (verl's
    ``training/rollout_probs_diff_mean``) is at most ``max_prob_diff``; without it NaN fails.
    """
    out: dict[str, float] = {}
    bad = []
    diffs = prob_diffs(metrics, policies)
    for policy, key in policies.items():
        if key not in metrics:
            continue
        valid = metrics.get(key.replace(AGREEMENT_METRIC, _VALID_METRIC), 1)
        if valid is not None and float(valid) == 0:
            continue
        value = float(metrics[key])
        out[policy] = value
        if math.isnan(value):
            diff = diffs.get(policy, math.nan)
            if not diff <= max_prob_diff:  # NaN diff fails too
                bad.append(f"{policy}: {key} undefined (constant token probabilities) and mean |p_rollout - "
                           f"p_actor| = {diff:.4g} > envace.max_rollout_actor_prob_diff={max_prob_diff}")
        elif value < floor:
            bad.append(f"{policy}: {key} = {value:.4g}")
    if bad:
        raise RolloutAgreementError(
            f"step {step}: rollout-vs-actor probability agreement below envace.min_rollout_actor_corr="
            f"{floor} ({'; '.join(bad)}): the rollout server does not sample from the policy being trained "
            "(weights not synced to it?); stopping instead of training on mismatched rollouts"
        )
    return out


class JudgeFailureError(RuntimeError):
    """Too many of a step's trajectories had a checklist verdict that failed (judge down or broken)."""


def extra_field(extra: Any, key: str, default: Any = None) -> Any:
    """``extra_fields[key]`` of one TransferQueue row, ``default`` when the row has none; the row and its
    values may come back from TransferQueue wrapped (``.data``)."""
    data = getattr(extra, "data", extra)
    if not hasattr(data, "get"):
        return default
    value = data.get(key, default)
    return getattr(value, "data", value)


def first_rows(extra_fields: Any, tags: Any) -> Iterator[Any]:
    """The ``extra_fields`` of each trajectory's first row (``envace_row == 0``), padding rows skipped:
    one entry per trajectory of the step, for per-trajectory counts."""
    for extra, tag in zip(extra_fields, list(tags) if tags else [None] * len(extra_fields), strict=True):
        if (tag and tag.get("is_padding", False)) or int(extra_field(extra, "envace_row", 0) or 0) != 0:
            continue
        yield extra


def judge_failure_stats(extra_fields: Any, tags: Any) -> dict[str, float]:
    """Per step, from the rows' ``extra_fields["reward_extra_info"]`` (set by the agent loop from
    :func:`envace.train.reward_fn.compute_score`, copied by verl to every row of a trajectory): counted once
    per trajectory, on its first row (``envace_row == 0``). Returns ``envace/judge/verdicts`` (the verdicts
    the checklist reward asked the judge for), ``envace/judge/failures`` (failed verdicts),
    ``envace/judge/failed_trajectories``, ``envace/judge/dropped`` and ``envace/judge/failed_share``
    (failed trajectories / trajectories; 0 when no judge ran)."""
    failures = failed = dropped = trajectories = verdicts = 0
    for extra in first_rows(extra_fields, tags):
        info = extra_field(extra, "reward_extra_info") or {}
        trajectories += 1
        n = int(float(info.get("judge_failures", 0) or 0)) if hasattr(info, "get") else 0
        verdicts += int(float(info.get("judge_verdicts", 0) or 0)) if hasattr(info, "get") else 0
        failures += n
        failed += n > 0
        dropped += bool(info.get("dropped", False)) if hasattr(info, "get") else 0
    return {
        "envace/judge/verdicts": float(verdicts),
        "envace/judge/failures": float(failures),
        "envace/judge/failed_trajectories": float(failed),
        "envace/judge/dropped": float(dropped),
        "envace/judge/failed_share": failed / trajectories if trajectories else 0.0,
    }


def termination_stats(extra_fields: Any, tags: Any) -> dict[str, float]:
    """Per step, how the trajectories ended: ``envace/termination/<reason>`` = the share of the step's
    trajectories whose rollout ended for ``reason`` (the agent loop's ``envace_termination``, an
    :class:`envace.core.rollout.Termination` value), counted once per trajectory on its first row; padding
    ignored. A run whose every episode ends ``rehearsal_malformed`` after one call (every reward 0, as
    the smoke runs before the warm start taught rehearsals) shows it here at step 1."""
    counts: dict[str, int] = {}
    for extra in first_rows(extra_fields, tags):
        reason = extra_field(extra, "envace_termination")
        if reason is not None:
            counts[str(reason)] = counts.get(str(reason), 0) + 1
    total = sum(counts.values())
    return {f"envace/termination/{r}": n / total for r, n in sorted(counts.items())}


def rehearse_reference_stats(extra_fields: Any, tags: Any) -> dict[str, float]:
    """Per step, how the rehearsed observations compare with the examples' reference responses (the agent
    loop's ``envace_rehearse_*`` counts, :func:`envace.core.fidelity.reference_agreement`), summed over the
    step's trajectories (first rows; padding ignored): ``envace/rehearse/answered`` (calls a model
    answered), ``envace/rehearse/malformed_share`` (of those), ``envace/rehearse/referenced_share`` (of
    those, the ones with a reference response), ``envace/rehearse/reference_exact`` and
    ``envace/rehearse/reference_agree`` (of the referenced: equal JSON value; same success/error kind).
    A share whose denominator is 0 is not logged (no model-answered call, e.g. a real-environment run)."""
    totals = dict.fromkeys(REFERENCE_COUNTS, 0)
    for extra in first_rows(extra_fields, tags):
        for key in REFERENCE_COUNTS:
            totals[key] += int(extra_field(extra, f"envace_rehearse_{key}", 0) or 0)
    out = {"envace/rehearse/answered": float(totals["answered"])}
    if totals["answered"]:
        out["envace/rehearse/malformed_share"] = totals["malformed"] / totals["answered"]
        out["envace/rehearse/referenced_share"] = totals["referenced"] / totals["answered"]
    if totals["referenced"]:
        out["envace/rehearse/reference_exact"] = totals["exact"] / totals["referenced"]
        out["envace/rehearse/reference_agree"] = totals["agree"] / totals["referenced"]
    return out


def check_judge_failures(stats: Mapping[str, float], max_share: float, step: int) -> None:
    """:class:`JudgeFailureError` when the step's failed-trajectory share exceeds ``max_share``."""
    share = float(stats.get("envace/judge/failed_share", 0.0))
    if share > max_share:
        raise JudgeFailureError(
            f"step {step}: {share:.0%} of the trajectories had a failed checklist verdict "
            f"({stats.get('envace/judge/failures', 0):.0f} failed verdicts) > envace.max_judge_failure_share="
            f"{max_share}: is the judge server (ENVACE_JUDGE_BASE_URL) down? Stopping instead of training "
            "on rewards of failed verdicts"
        )


def row_penalty_of(extra: Any) -> float:
    """A row's ``extra_fields["envace_row_penalty"]`` (0 when absent: padding, other agent loops); the
    values may come back from TransferQueue wrapped (``.data``)."""
    return float(extra_field(extra, "envace_row_penalty", 0.0) or 0.0)


def penalised_scores(rows: list[Any], penalties: list[float]) -> list[Any]:
    """Token-level reward rows (shape ``[response_len]`` each, the reward on the last token, as verl's
    ``AgentLoopOutput.as_dict`` writes ``rm_scores``) with ``penalties[i]`` added to row ``i``'s last
    token."""
    out = []
    for row, penalty in zip(rows, penalties, strict=True):
        if penalty:
            row = row.clone()
            row[-1] += penalty
        out.append(row)
    return out


def row_role(extra: Any, tag: dict[str, Any] | None) -> str | None:
    """The role of one TransferQueue row (``None`` for a padding row)."""
    if tag and tag.get("is_padding", False):
        return None
    role = extra_field(extra, "envace_role")
    if role is not None:
        return str(role)
    raise ValueError("a training row has no extra_fields['envace_role']: is the agent loop envace_rehearsal?")


class _SaveAfterLog:
    """verl's ``Tracking`` with a deferred checkpoint: after ``log(step=N)`` returns, the checkpoint
    of step N that the fit loop asked for (:meth:`EnvaceTrainer._save_checkpoint`) is written."""

    def __init__(self, tracking: Any, trainer: EnvaceTrainer) -> None:
        self._tracking, self._trainer = tracking, trainer

    def log(self, data: dict, step: int, *args: Any, **kwargs: Any) -> None:
        self._tracking.log(data, step, *args, **kwargs)
        if self._trainer._pending_save == step:
            self._trainer._save_now()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tracking, name)


@register_trainer(TRAINER_MODE)
class EnvaceTrainer(PPOTrainerSync):
    """verl's sync trainer with role-aware advantage groups; see the module docstring."""

    _pending_save: int | None = None
    _tracking: Any = None
    _refilled = 0  # prompts drawn this step to replace filtered groups (_add_prompts_to_generate)
    _filter_metric: str | None = None  # the replay buffer's group-filtering metric (None: filtering off)

    @property
    def logger(self) -> Any:
        return self._tracking

    @logger.setter
    def logger(self, tracking: Any) -> None:  # verl's fit() sets ``self.logger = Tracking(...)``
        self._tracking = _SaveAfterLog(tracking, self)

    def _save_checkpoint(self) -> None:
        """Called by verl's fit loop before step N's metrics exist; written after they are logged."""
        if self._tracking is None:  # not inside fit(): nothing will log, save at once
            self._save_now()
        else:
            self._pending_save = self.global_steps

    def _save_now(self) -> None:
        self._pending_save = None
        super()._save_checkpoint()

    def _balance_batch(self, batch: Any, metrics: dict, *args: Any, **kwargs: Any) -> Any:
        """With ``envace.batch_padding: copy``, the authors' padding by copies first
        (:mod:`envace.train.verl_ext.padding`; logged as ``envace/padding/copied_rows``), then verl's."""
        if self.batch_padding == "copy":
            import numpy as np

            seed = int(self.config.data.get("seed", None) or 0)
            rng = np.random.default_rng([seed, int(self.global_steps), len(batch.keys)])
            batch, copied = pad_with_copies(batch, self.padding_multiple, rng)
            metrics["envace/padding/copied_rows"] = metrics.get("envace/padding/copied_rows", 0) + copied
        return super()._balance_batch(batch, metrics, *args, **kwargs)

    def _build_replay_buffer(self) -> Any:
        self.trainer_mode = "sync"  # see the module docstring: verl tests the name, not the class
        self.parameter_sync_step = self.config.trainer.v1.get("sync", {}).get("parameter_sync_step", 1)
        buffer = super()._build_replay_buffer()
        self._filter_metric = getattr(buffer, "filter_groups_metric", None)
        return buffer

    def __init__(self, config: Any) -> None:
        envace = config.get("envace", None) or {}
        self.batch_padding = str(envace.get("batch_padding", "mask"))
        if self.batch_padding not in ("copy", "mask"):
            raise ValueError(f"envace.batch_padding must be copy or mask, got {self.batch_padding!r}")
        self.padding_multiple = int(envace.get("padding_multiple", 1))
        self.min_agreement = float(envace.get("min_rollout_actor_corr", DEFAULT_MIN_AGREEMENT))
        self.max_prob_diff = float(envace.get("max_rollout_actor_prob_diff", DEFAULT_MAX_PROB_DIFF))
        self.max_refill = (int(envace.get("max_filter_refill_batches", DEFAULT_MAX_REFILL_BATCHES))
                           * int(config.data.train_batch_size))
        if self.min_agreement > 0 and not config.actor_rollout_ref.rollout.get("calculate_log_probs", True):
            raise ValueError(
                "envace.min_rollout_actor_corr needs actor_rollout_ref.rollout.calculate_log_probs=true "
                "(the agreement is computed from the rollout log-probs); set the floor to 0 to disable it"
            )
        super().__init__(config)

    #: Also compute the agreement on each role's rows (``envace/<role>/training/...``): one policy
    #: serves both roles here, so a role sampled with other settings than the actor scores (e.g. another
    #: temperature) shows only in its own rows. The per-role trainer's passes are one role each already.
    agreement_by_role = True

    def _rollout_agreement_metrics(self) -> dict[str, str]:
        """``{name: metric key}`` the guard checks: the shared policy on all rows and on each role's rows."""
        by_role = {f"shared/{r}": f"envace/{r}/{AGREEMENT_METRIC}" for r in ROLES}
        return {"shared": AGREEMENT_METRIC, **by_role}

    def _compute_old_log_prob(self, batch: Any, metrics: dict) -> Any:
        batch = super()._compute_old_log_prob(batch, metrics)
        if self.agreement_by_role and self.config.actor_rollout_ref.rollout.get("calculate_log_probs", True):
            metrics.update(self._role_agreement(batch))
        return batch

    def _role_agreement(self, batch: Any) -> dict[str, float]:
        """verl's ``calculate_debug_metrics`` on each role's rows, read back from TransferQueue (the fields
        verl's old-log-prob pass wrote and read), as ``envace/<role>/training/...``."""
        import transfer_queue as tq
        from verl.protocol import DataProto
        from verl.utils.debug.metrics import calculate_debug_metrics

        roles = self._row_roles(batch)
        out: dict[str, float] = {}
        for role in ROLES:
            keys = [k for k, r in zip(batch.keys, roles, strict=True) if r == role]
            if not keys:
                continue
            data = tq.kv_batch_get(
                keys=keys,
                partition_id=batch.partition_id,
                select_fields=["old_log_probs", "rollout_log_probs", "response_mask", "responses"],
            )
            m = calculate_debug_metrics(DataProto(batch=data.to_padded_tensor()))
            out.update({f"envace/{role}/{k}": float(v) for k, v in m.items()})
        return out

    def _add_prompts_to_generate(self, num_prompts: int) -> int:
        """verl's replay buffer draws replacements for filtered groups through this (group filtering,
        ``algorithm.filter_groups``); counted per step. The draw that reaches the step's bound
        (:func:`refill_reaches_cap`) turns filtering off until the step ends; see the module docstring."""
        self._refilled += num_prompts
        if refill_reaches_cap(self._refilled, self.max_refill):
            self.replay_buffer.filter_groups_metric = None
        return super()._add_prompts_to_generate(num_prompts)

    def step(self, metrics: dict, timing_raw: dict) -> Any:
        """verl's step, then the agreement guard (before the checkpoint and the weight sync)."""
        self._refilled = 0
        try:
            batch = super().step(metrics, timing_raw)
        finally:
            capped = self._filter_metric is not None and self.replay_buffer.filter_groups_metric is None
            if self._filter_metric is not None:
                self.replay_buffer.filter_groups_metric = self._filter_metric
        if self._filter_metric is not None:
            metrics["envace/filter_groups/refilled_prompts"] = self._refilled
            metrics["envace/filter_groups/capped"] = int(capped)
        policies = self._rollout_agreement_metrics()
        agreement = check_rollout_agreement(
            metrics, policies, self.min_agreement, self.global_steps, self.max_prob_diff
        )
        metrics.update({f"envace/rollout_actor_corr/{p}": v for p, v in agreement.items()})
        diffs = prob_diffs(metrics, policies)
        metrics.update({f"envace/rollout_actor_prob_diff/{p}": diffs[p] for p in agreement if p in diffs})
        return batch

    def _row_roles(self, batch: Any, extra_fields: Any = None) -> list[str | None]:
        """Each row's role (``None`` for padding), read from TransferQueue unless ``extra_fields`` given."""
        if extra_fields is None:
            import transfer_queue as tq

            extra_fields = tq.kv_batch_get(
                keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"]
            )["extra_fields"]
        tags = list(batch.tags) if batch.tags else [None] * len(batch.keys)
        return [row_role(e, t) for e, t in zip(extra_fields, tags, strict=True)]

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        import transfer_queue as tq
        from verl.utils.tensordict_utils import list_of_dict_to_tensordict

        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["uid", "extra_fields"]
        )
        uids = [getattr(u, "data", u) for u in data["uid"]]
        roles = self._row_roles(batch, data["extra_fields"])
        for role in ("act", "rehearse"):  # rows per role this step (the per-role trainer logs the same)
            metrics.setdefault(f"envace/rows/{role}", sum(r == role for r in roles))
        judge = judge_failure_stats(data["extra_fields"], batch.tags)
        metrics.update(judge)
        metrics.update(termination_stats(data["extra_fields"], batch.tags))
        metrics.update(rehearse_reference_stats(data["extra_fields"], batch.tags))
        envace = self.config.get("envace", None) or {}
        check_judge_failures(judge, float(envace.get("max_judge_failure_share", 0.5)), self.global_steps)
        self._apply_row_penalties(batch, data["extra_fields"], metrics)
        grouped = role_group_ids(uids, roles)
        tq.kv_batch_put(
            keys=batch.keys,
            partition_id=batch.partition_id,
            fields=list_of_dict_to_tensordict([{"uid": g} for g in grouped]),
        )
        try:
            return super()._compute_advantage(batch, metrics)
        finally:
            tq.kv_batch_put(
                keys=batch.keys,
                partition_id=batch.partition_id,
                fields=list_of_dict_to_tensordict([{"uid": u} for u in uids]),
            )

    def _apply_row_penalties(self, batch: Any, extra_fields: Any, metrics: dict) -> None:
        """Add each row's ``envace_row_penalty`` (the agent loop's, e.g. -0.1 for a blank row) to its
        reward in TransferQueue (``rm_scores``, reward on the last token) before verl's advantage step."""
        penalties = [row_penalty_of(e) for e in extra_fields]
        metrics["envace/rows/penalised"] = sum(p != 0 for p in penalties)
        if not any(penalties):
            return
        import torch
        import transfer_queue as tq
        from verl.utils import tensordict_utils as tu

        keys, part = batch.keys, batch.partition_id
        scores = tq.kv_batch_get(keys=keys, partition_id=part, select_fields=["rm_scores"])
        rows = penalised_scores(list(scores["rm_scores"].unbind()), penalties)
        tq.kv_batch_put(keys=keys, partition_id=part, fields=tu.get_tensordict(
            {"rm_scores": torch.nested.as_nested_tensor(rows, layout=torch.jagged)}))

    def _update_actor(self, batch: Any, metrics: dict) -> Any:
        envace = self.config.get("envace", None) or {}
        if not envace.get("one_update_per_batch", True):
            return super()._update_actor(batch, metrics)
        actor = self.config.actor_rollout_ref.actor
        n = int(self.config.actor_rollout_ref.rollout.n)
        saved = actor.ppo_mini_batch_size
        with open_dict(actor):
            actor.ppo_mini_batch_size = -(-len(batch.keys) // n)
        try:
            return super()._update_actor(batch, metrics)
        finally:
            with open_dict(actor):
                actor.ppo_mini_batch_size = saved
