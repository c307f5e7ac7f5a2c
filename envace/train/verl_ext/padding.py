"""The authors' batch padding: copies of random rows, not verl's masked synthetic rows.

Implemented (``training.runs.<run>.batch_padding: copy``, deviation ``batch-padding``): before verl
balances a step's rows over its data-parallel ranks (``_balance_batch``, which comes before the log-prob,
advantage and update passes), :func:`pad_with_copies` appends copies of the step's own rows until the
row count is a multiple of ``multiple``: the whole batch while at least a batch is missing, then
distinct random rows. A copy is the source row's every field (its ``uid`` included) under a new
TransferQueue key, so it joins its group's baseline and counts in the loss like the original: the
authors' ``adjust_batch`` (``agent_system/multi_turn_rollout/utils.py``, mode ``copy``) with their
divisor, lcm(log-prob micro-batch 8, actor micro-batch 1) = 8 rows per GPU
(``log_prob_micro_batch_size_per_gpu=8`` and the agents' ``ppo_micro_batch_size_per_gpu=1`` of the launch
scripts) times the run's GPUs: 128 rows at 2 nodes x 8.
verl then finds nothing left to pad when its own multiple divides that one, and pads the rest with its
masked rows (``verl.trainer.ppo.padding_utils.upsample_batch_to_divisible_size``) otherwise.

``batch_padding: mask`` (ours before) leaves verl's own padding alone: synthetic rows with no loss, in a
group of their own.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

import numpy as np

__all__ = ["AUTHORS_ROWS_PER_GPU", "copy_indices", "pad_with_copies"]

#: The authors' padding rows per GPU: lcm of run_checklist_*.sh's log_prob_micro_batch_size_per_gpu=8 and
#: the agents' ppo_micro_batch_size_per_gpu=1; their divisor is this times the GPUs of the run.
AUTHORS_ROWS_PER_GPU = 8


def copy_indices(n: int, to_add: int, rng: np.random.Generator) -> list[int]:
    """Which of ``n`` rows to copy for ``to_add`` more: every row while ``to_add >= n``, then
    ``to_add mod n`` distinct random rows."""
    out: list[int] = []
    while to_add - len(out) >= n:
        out += range(n)
    rest = to_add - len(out)
    return out + sorted(int(i) for i in rng.choice(n, size=rest, replace=False)) if rest else out


def _copied(value: Any) -> Any:
    import torch

    return value.clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)


def pad_with_copies(batch: Any, multiple: int, rng: np.random.Generator) -> tuple[Any, int]:
    """``(batch, copies)``: ``batch`` (a TransferQueue ``KVBatchMeta``) with copies of its rows appended
    so its length is a multiple of ``multiple``, and how many were appended."""
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    n = len(batch.keys)
    to_add = (-n) % multiple if n else 0
    if to_add == 0:
        return batch, 0
    sources = copy_indices(n, to_add, rng)
    rows: dict[int, dict[str, Any]] = {}
    for i in sorted(set(sources)):  # one read per source row (rows are unpadded: lengths differ)
        sample = tq.kv_batch_get(keys=[batch.keys[i]], partition_id=batch.partition_id)[0]
        rows[i] = {k: _copied(sample[k]) for k in sample.keys()}  # noqa: SIM118 (a TensorDict's keys)
    prefix = f"copy{uuid.uuid4().hex}"  # verl reads a key's uid as its first "_" part: none of a real row
    keys = [f"{prefix}_{j}_0" for j in range(len(sources))]
    tags = [copy.deepcopy(batch.tags[i]) for i in sources]
    tq.kv_batch_put(keys=keys, partition_id=batch.partition_id,
                    fields=list_of_dict_to_tensordict([{k: _copied(v) for k, v in rows[i].items()}
                                                      for i in sources]), tags=tags)
    padded = KVBatchMeta(keys=list(batch.keys) + keys, tags=list(batch.tags) + tags,
                         partition_id=batch.partition_id, fields=batch.fields, extra_info=batch.extra_info)
    return padded, len(sources)
