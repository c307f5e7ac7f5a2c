"""Role-wise GRPO advantages (EnvACE, "Role-wise GRPO").

Implemented: for output rows (one row per generation: one ACT turn or one REHEARSE reply), each with the
uid of its prompt group, its role and the trajectory-level reward ``R`` of the rollout it belongs to,

    A = R - mu(uid, role),    mu(uid, role) = mean of R over the rows of that role in that uid's group.

The mean is taken over *rows*, not over rollouts: a rollout that produced more outputs of a role weighs
more in that role's baseline. This matches the authors' code (GRPO group key = (prompt uid, role)).

Options and conventions (ours, documented):
- ``norm_by_std=True`` divides by the per-(uid, role) population std (ddof=0) plus ``eps``. The paper
  and the authors' launch script use no std normalisation, so the default is ``False``.
- A (uid, role) group with a single row: ``singleton="reward"`` (default, the authors' verl GRPO,
  ``compute_grpo_outcome_advantage``: a one-score group gets mean 0 and std 1) gives ``A = R``
  (``R / (1 + eps)`` with ``norm_by_std``); ``singleton="zero"`` (ours before) gives 0, the row's own
  reward being its baseline.
- Standard GRPO is the same function with a single role for every row.

The function returns one scalar per row; broadcasting it over the row's response tokens is the
trainer's job.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["role_wise_grpo"]


def role_wise_grpo(
    uids: Sequence[object] | np.ndarray,
    roles: Sequence[object] | np.ndarray,
    rewards: Sequence[float] | np.ndarray,
    *,
    norm_by_std: bool = False,
    eps: float = 1e-6,
    singleton: str = "reward",
) -> np.ndarray:
    """Role-wise GRPO advantage per output row.

    Args:
        uids: shape ``(N,)``; the prompt-group id of each row. Ids are compared by ``str()``, so
            ``1`` and ``"1"`` are the same group.
        roles: shape ``(N,)``; the role of each row (e.g. ``"act"`` / ``"rehearse"``), compared by
            ``str()``.
        rewards: shape ``(N,)``; the trajectory reward of the rollout each row belongs to.
        norm_by_std: divide by the per-(uid, role) std (ddof=0) + ``eps``.
        eps: added to the std when ``norm_by_std``.
        singleton: advantage of a one-row group: ``"reward"`` (``A = R``, verl's GRPO) or ``"zero"``.

    Returns:
        ``np.ndarray`` of shape ``(N,)``, dtype float64.

    Raises:
        ValueError: lengths differ, an input is not one-dimensional, a reward is NaN/inf, or
            ``singleton`` is not ``"reward"`` / ``"zero"``.
    """
    if singleton not in ("reward", "zero"):
        raise ValueError(f"singleton must be 'reward' or 'zero', got {singleton!r}")
    uid_arr = np.asarray(uids, dtype=object)
    role_arr = np.asarray(roles, dtype=object)
    reward_arr = np.asarray(rewards, dtype=np.float64)
    for name, arr in (("uids", uid_arr), ("roles", role_arr), ("rewards", reward_arr)):
        if arr.ndim != 1:
            raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    n = reward_arr.shape[0]
    if uid_arr.shape[0] != n or role_arr.shape[0] != n:
        raise ValueError(
            f"uids, roles and rewards must have the same length, got {uid_arr.shape[0]}, "
            f"{role_arr.shape[0]} and {n}"
        )
    if not np.all(np.isfinite(reward_arr)):
        bad = np.flatnonzero(~np.isfinite(reward_arr))
        raise ValueError(f"rewards must be finite; non-finite at rows {bad[:10].tolist()}")
    if n == 0:
        return np.zeros(0, dtype=np.float64)

    # Group key (uid, role): factorise each column separately (object arrays of mixed types cannot be
    # sorted jointly), then combine the two integer codes.
    _, uid_code = np.unique(uid_arr.astype(str), return_inverse=True)
    _, role_code = np.unique(role_arr.astype(str), return_inverse=True)
    pair = uid_code.astype(np.int64) * (int(role_code.max()) + 1) + role_code
    _, group = np.unique(pair, return_inverse=True)

    counts = np.bincount(group).astype(np.float64)
    mean = np.bincount(group, weights=reward_arr) / counts
    single = counts[group] == 1
    adv = reward_arr - mean[group]
    if norm_by_std:
        var = np.bincount(group, weights=adv * adv) / counts
        adv = adv / (np.sqrt(var)[group] + eps)
    # verl: a one-score group has mean 0 and std 1, so A = R (or R / (1 + eps) normalised)
    adv[single] = (reward_arr[single] / (1.0 + eps) if norm_by_std else reward_arr[single]) \
        if singleton == "reward" else 0.0
    return adv
