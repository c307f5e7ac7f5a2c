"""envace.train.verl_ext.padding: the authors' padding by copies, against a stand-in TransferQueue (the
real one runs inside main_ppo in the smoke DAG's per-role run)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transfer_queue
from transfer_queue import KVBatchMeta

from envace.train.verl_ext.padding import copy_indices, pad_with_copies


def test_copy_indices_take_the_whole_batch_then_distinct_random_rows() -> None:
    rng = np.random.default_rng(0)
    assert copy_indices(5, 0, rng) == []
    three = copy_indices(5, 3, rng)
    assert len(three) == len(set(three)) == 3 and set(three) <= set(range(5))
    seven = copy_indices(3, 7, rng)
    assert seven[:6] == [0, 1, 2, 0, 1, 2] and len(seven) == 7 and seven[6] in range(3)


@pytest.fixture
def store(monkeypatch):
    """A dict-backed stand-in for TransferQueue's key-value calls."""
    from tensordict import TensorDict

    rows: dict[str, dict] = {}

    def kv_batch_get(keys, partition_id, select_fields=None):
        assert partition_id == "train"
        return [dict(rows[k]) for k in keys]

    def kv_batch_put(keys, partition_id, fields=None, tags=None):
        assert isinstance(fields, TensorDict) and len(keys) == len(tags) == fields.batch_size[0]
        for i, key in enumerate(keys):
            rows[key] = {name: fields[i][name] for name in fields.keys()}  # noqa: SIM118
        return None

    monkeypatch.setattr(transfer_queue, "kv_batch_get", kv_batch_get)
    monkeypatch.setattr(transfer_queue, "kv_batch_put", kv_batch_put)
    return rows


def test_copies_fill_the_batch_to_the_multiple_with_every_field_of_their_source(store) -> None:
    keys = [f"u{i}_0_{i}" for i in range(5)]
    for i, key in enumerate(keys):
        store[key] = {"input_ids": torch.arange(i + 2), "uid": f"u{i}", "rm_scores": torch.tensor([float(i)])}
    tags = [{"is_padding": False, "seq_len": i + 2} for i in range(5)]
    batch = KVBatchMeta(keys=keys, tags=tags, partition_id="train")
    padded, copied = pad_with_copies(batch, 8, np.random.default_rng(1))
    assert copied == 3 and len(padded.keys) == 8 and padded.keys[:5] == keys
    new = padded.keys[5:]
    prefixes = {k.split("_")[0] for k in new}  # verl's uid part of a key: one new one, no real row's
    assert len(prefixes) == 1 and not prefixes & {f"u{i}" for i in range(5)}
    for key, tag in zip(new, padded.tags[5:], strict=True):
        source = tag["seq_len"] - 2  # the tags are the source's
        assert not tag["is_padding"] and store[key]["uid"] == f"u{source}"  # joins the source's group
        assert torch.equal(store[key]["input_ids"], torch.arange(source + 2))
    same, none = pad_with_copies(padded, 8, np.random.default_rng(1))
    assert none == 0 and same is padded
