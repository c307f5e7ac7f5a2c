"""Role-wise GRPO as a verl advantage estimator (``algorithm.adv_estimator=envace_role_wise``).

Implemented: :func:`compute_role_wise_advantage`, registered with verl's ``register_adv_est``. verl calls
it with ``token_level_rewards`` and ``response_mask`` (shape ``(N, T)``) and ``index`` (shape ``(N,)``),
the rows' group ids; it returns ``(advantages, returns)``, both ``(N, T)``, with each row's scalar
advantage from :func:`envace.core.advantage.role_wise_grpo` broadcast over its response tokens (0 on masked
tokens). verl does not pass ``non_tensor_batch`` to estimators, so the role reaches it through the group
id: :func:`role_group_ids` turns ``(uid, role)`` into ``"<uid>::<role>"`` (done by
:class:`envace.train.verl_ext.trainer.EnvaceTrainer` before verl's advantage step). With role-aware ids,
grouping by id alone is exactly the paper's per-(prompt, role) baseline, counted over rows as in the
authors' code; no std normalisation unless ``algorithm.norm_adv_by_std_in_grpo`` is true. A one-row
group gets ``A = R`` (``algorithm.envace_singleton_advantage: reward``, the authors' verl GRPO) or 0
(``zero``, ours before); set from ``training.runs.<run>.episode.singleton_advantage``.
``algorithm.envace_advantage_sign`` (``episode.advantage_sign``, default 1) multiplies every advantage:
-1 is the negative control of the learning test (a correct trainer then unlearns), never a method setting.
``algorithm.envace_rehearse_advantage`` (``episode.rehearse_advantage``, default ``train``): ``zero`` sets
the advantage of every REHEARSE row (id ending ``::rehearse``) to 0 after the baselines are taken, the
control that tells whether the REHEARSE updates do anything; the ACT rows' advantages are unchanged.

Rows whose id starts with :data:`PAD_PREFIX` (or whose response mask is all zero) form no group with
anything else: padding never enters a baseline.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import register_adv_est

from envace.core.advantage import role_wise_grpo

__all__ = ["ESTIMATOR", "PAD_PREFIX", "role_group_ids", "compute_role_wise_advantage"]

ESTIMATOR = "envace_role_wise"
REHEARSE = "rehearse"  # the role name the agent loop writes (envace_role)
PAD_PREFIX = "__pad__"


def role_group_ids(uids: Any, roles: Any) -> np.ndarray:
    """``"<uid>::<role>"`` per row, shape ``(N,)`` object array; ``roles`` entries may be ``None``
    (padding rows), which get a unique :data:`PAD_PREFIX` id."""
    uids = list(uids)
    roles = list(roles)
    if len(uids) != len(roles):
        raise ValueError(f"{len(uids)} uids but {len(roles)} roles")
    out = [
        f"{u}::{r}" if r is not None else f"{PAD_PREFIX}{i}"
        for i, (u, r) in enumerate(zip(uids, roles, strict=True))
    ]
    return np.array(out, dtype=object)


@register_adv_est(ESTIMATOR)
def compute_role_wise_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Role-wise GRPO advantages, ``(N, T)`` each (see the module docstring)."""
    if index is None:
        raise ValueError(f"{ESTIMATOR} needs the row group ids (uid) in the batch")
    rewards = (token_level_rewards * response_mask).sum(dim=-1).detach().cpu().double().numpy()
    ids = np.asarray(index, dtype=object).astype(str)
    empty = (response_mask.sum(dim=-1) == 0).cpu().numpy()
    ids = np.where(
        empty | np.char.startswith(ids.astype(str), PAD_PREFIX),
        np.array([f"{PAD_PREFIX}{i}" for i in range(len(ids))], dtype=object),
        ids,
    )
    norm = bool(config.get("norm_adv_by_std_in_grpo", False)) if config is not None else False
    singleton = str(config.get("envace_singleton_advantage", "reward")) if config is not None else "reward"
    sign = int(config.get("envace_advantage_sign", 1)) if config is not None else 1
    if sign not in (1, -1):
        raise ValueError(f"algorithm.envace_advantage_sign must be 1 or -1, got {sign}")
    rehearse = str(config.get("envace_rehearse_advantage", "train")) if config is not None else "train"
    if rehearse not in ("train", "zero"):
        raise ValueError(f"algorithm.envace_rehearse_advantage must be 'train' or 'zero', got {rehearse!r}")
    adv = sign * role_wise_grpo(ids, np.zeros(len(ids), dtype=np.int64), rewards, norm_by_std=norm,
                                singleton=singleton)
    if rehearse == "zero":
        adv[np.char.endswith(ids.astype(str), f"::{REHEARSE}")] = 0.0
    scores = torch.as_tensor(adv, dtype=token_level_rewards.dtype, device=token_level_rewards.device)
    scores = scores.unsqueeze(-1) * response_mask
    return scores, scores
