"""CM2 conversion: CM2's release layout (tests/data/cm2_release) and the former hand-written fixture (the
smoke source); normalisation, bad records, filtering, parquet round trip."""

from __future__ import annotations

import json

import pytest

from envace.cli.main import main
from envace.common.config import load_config
from envace.train.data import (
    BadRecord,
    convert,
    count_prompt_tokens,
    normalize_record,
    read_training_parquet,
    write_training_parquet,
)

from .conftest import FIXTURE

RELEASE = FIXTURE.parent / "cm2_release"


def _lines() -> list[str]:
    return FIXTURE.read_text().splitlines()


def test_bad_records_are_counted_with_index_and_reason(converted):
    examples, summary = converted
    lines = _lines()
    bad_expected = []
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            bad_expected.append(i)
            continue
        turns = [t["items"] if isinstance(t, dict) else t for t in rec["checklists"]]
        if "tools" not in rec or any(sum(it["weight"] for it in items) == 0 for items in turns):
            bad_expected.append(i)
    assert [b["index"] for b in summary.bad] == bad_expected
    assert all(b["reason"] for b in summary.bad)
    assert summary.total == len(lines)
    assert summary.kept == len(examples) == len(lines) - len(bad_expected)


def test_prompt_is_initial_chat_and_references_are_privileged(converted):
    examples, _ = converted
    by_uid = {e.uid: e for e in examples}
    ex = by_uid["fx-order-0"]
    # system + first user only; later user turns are not part of the prompt
    assert [m["role"] for m in ex.prompt] == ["system", "user"]
    assert "order 12345" in ex.prompt[-1]["content"]
    assert ex.reference_calls == [{"name": "order_status", "arguments": {"order_id": "12345"}}]
    assert ex.reference_answer == "Order 12345 has shipped."  # the first turn's, not a later turn's
    assert ex.references[0]["response"]["status"] == "shipped"
    assert len(ex.checklists) == 2  # one per user turn
    for turn in ex.checklists:
        assert sum(item["weight"] for item in turn) == pytest.approx(1.0)
    # tools given as a JSON string are decoded
    assert ex.tools[0]["function"]["name"] == "order_status"


def test_parallel_calls_matched_by_tool_call_id(converted):
    examples, _ = converted
    ex = next(e for e in examples if e.uid == "fx-weather-par")
    pairs = {r["call"]["arguments"]["city"]: r["response"]["city"] for r in ex.references}
    assert pairs == {"Paris": "Paris", "Rome": "Rome"}


def test_weights_rescaled_to_one(converted):
    examples, _ = converted
    ex = next(e for e in examples if e.uid == "fx-add-0")  # raw weights 2 and 1
    assert [round(i["weight"], 6) for i in ex.checklists[0]] == [round(2 / 3, 6), round(1 / 3, 6)]


@pytest.mark.parametrize("record, reason", [
    ({"tools": [{"name": "f"}], "messages": [{"role": "assistant", "content": "x"}], "checklists": [[]]},
     "first non-system message"),
    ({"tools": [{"name": "f"}], "messages": [{"role": "user", "content": "q"},
                                            {"role": "tool", "content": "{}"}],
      "checklists": [[{"question": "q?"}]]}, "answers no call"),
    ({"tools": [{"name": "f"}], "messages": [{"role": "user", "content": "q"},
                                            {"role": "assistant", "tool_calls": [
                                                {"function": {"name": "f", "arguments": "{bad"}}]}],
      "checklists": [[{"question": "q?"}]]}, "not JSON"),
    ({"tools": [{"name": "f"}], "messages": [{"role": "user", "content": "q"}],
      "checklists": [[{"question": "a?"}], [{"question": "b?"}]]}, "2 checklists for 1 user turns"),
])
def test_normalize_rejects(record, reason):
    with pytest.raises(BadRecord, match=reason):
        normalize_record(record, 0)


def test_length_filter_uses_the_tokenizer(tokenizer, converted):
    examples, _ = converted
    lengths = sorted(e.prompt_tokens for e in examples)
    cut = lengths[len(lengths) // 2]
    kept, summary = convert(str(FIXTURE), tokenizer, cut)
    assert all(e.prompt_tokens <= cut for e in kept)
    assert len(summary.filtered) == sum(n > cut for n in lengths)
    assert all(f["prompt_tokens"] > cut for f in summary.filtered)
    assert examples[0].prompt_tokens == count_prompt_tokens(tokenizer, examples[0])


def test_parquet_round_trip(tmp_path, converted):
    examples, _ = converted
    path = tmp_path / "train.parquet"
    write_training_parquet(examples, path)
    back = read_training_parquet(path)
    assert back == examples
    import pyarrow.parquet as pq

    cols = set(pq.read_table(path).column_names)
    assert {"prompt", "data_source", "reward_model", "extra_info"} <= cols


def test_missing_local_source_is_a_clear_error(tokenizer, tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        convert(str(tmp_path / "nope.jsonl"), tokenizer, 100)


@pytest.fixture(scope="module")
def release(tokenizer):
    return convert(str(RELEASE / "cm2_forverl.parquet"), tokenizer, 3500)


@pytest.fixture
def release_config(tmp_path, repo_root):
    """config/smoke.yaml reading the CM2 release fixture (the smoke DAG still trains on the former
    fixture, which the tiny model's warm start is tuned to)."""
    import yaml

    cfg = yaml.safe_load((repo_root / "config" / "smoke.yaml").read_text())
    cfg["training"]["data"]["source"] = str(RELEASE / "cm2_forverl.parquet")
    path = tmp_path / "release_config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_release_json_and_parquet_read_the_same(tokenizer, release):
    """The converter's JSON list and CM2's parquet of it (Arrow-unified structs) give the same examples."""
    from_json = convert(str(RELEASE / "cm2_forverl.json"), tokenizer, 3500)
    assert from_json[0] == release[0]
    assert from_json[1].bad == release[1].bad


def test_release_rows_are_the_converter_layout():
    import pyarrow.parquet as pq

    rows = json.loads((RELEASE / "cm2_forverl.json").read_text())
    assert set(pq.read_table(RELEASE / "cm2_forverl.parquet").column_names) == {
        "uuid", "messages", "checklists", "extra_info", "data_source"}
    for row in rows:
        info = row["extra_info"]
        if info is None:
            continue
        assert set(info) == {"messages", "tools", "interaction_kwargs", "need_tools_kwargs", "original_index"}
        assert "tools" not in row and isinstance(info["tools"], str)
        assert info["interaction_kwargs"]["name"] == "checklist"
        assert info["original_index"] == row["uuid"]


def test_release_bad_records_each_have_a_reason(release):
    examples, summary = release
    rows = json.loads((RELEASE / "cm2_forverl.json").read_text())
    bad = [i for i, r in enumerate(rows) if r["uuid"].startswith("bad-")] + [
        i for i, r in enumerate(rows) if r["uuid"] == "cm2-add-0"][1:]
    assert sorted(b["index"] for b in summary.bad) == sorted(bad)
    reasons = [b["reason"] for b in summary.bad]
    assert len(set(reasons)) == len(reasons)  # one kind each
    assert summary.total == len(rows) and summary.kept == len(examples) == len(rows) - len(bad)
    assert any("OpenAIFunctionToolSchema" in r for r in reasons)


def test_release_multi_turn_dialogue(release):
    ex = next(e for e in release[0] if e.uid == "cm2-order-0")
    assert [m["role"] for m in ex.prompt] == ["system", "user"]
    assert ex.user_turns == ["And the weather in Paris?", "Then please cancel order 12345."]
    assert len(ex.checklists) == 3  # one per user turn
    assert ex.reference_calls == [{"name": "order_status", "arguments": {"order_id": "12345"}}]
    assert [r["call"]["name"] for r in ex.references] == ["order_status", "cancel_order"]
    assert ex.references[1]["response"] == {"order_id": "12345", "cancelled": True}
    item = ex.checklists[0][0]
    # CM2's own item fields, unchanged
    assert {"id", "evidence", "focus_on", "question", "pass_condition", "failure_examples",
            "required_for_next_turn", "dependence", "weight"} <= set(item)
    assert item["evidence"][0]["snippet"] and item["required_for_next_turn"] is True
    for turn in ex.checklists:
        assert sum(i["weight"] for i in turn) == pytest.approx(1.0)


def test_release_tool_calls_and_results(release):
    ex = next(e for e in release[0] if e.uid == "cm2-weather-par")
    assert ex.user_turns == []
    assert [(r["call"]["arguments"]["city"], r["response"]["city"]) for r in ex.references] == [
        ("Paris", "Paris"), ("Rome", "Rome")]  # no tool_call_id in CM2: answered in order


def test_user_turns_follow_the_checklist_turns():
    """Authors' interaction.py: the number of turns is len(checklist_list[0]); later user messages are not
    replayed."""
    rows = json.loads((RELEASE / "cm2_forverl.json").read_text())
    row = next(r for r in rows if r["uuid"] == "cm2-order-0")
    for ann in row["extra_info"]["interaction_kwargs"]["checklist_list"]:
        del ann[1:]
    ex = normalize_record(row, 0)
    assert ex.user_turns == [] and len(ex.checklists) == 1


def test_cm2_labelled_record_reads_like_its_row():
    rows = json.loads((RELEASE / "cm2_forverl.json").read_text())
    row = next(r for r in rows if r["uuid"] == "cm2-order-0")
    labelled = {"uuid": row["uuid"], "messages": row["extra_info"]["messages"],
                "tools": json.loads(row["extra_info"]["tools"]), "checklists": row["checklists"]}
    assert normalize_record(labelled, 0) == normalize_record(row, 0)


def test_user_turns_round_trip_and_default(tmp_path, release):
    path = tmp_path / "t.parquet"
    write_training_parquet(release[0], path)
    assert read_training_parquet(path) == release[0]
    row = release[0][0].to_row()
    del row["extra_info"]["user_turns"]
    assert type(release[0][0]).from_row(row).user_turns == []


def test_data_cli(tmp_path, repo_root, monkeypatch, release, release_config):
    converted = release
    monkeypatch.chdir(repo_root)
    out, summary = tmp_path / "d.parquet", tmp_path / "s.json"
    rc = main(["data", "--config", release_config, "--out", str(out), "--summary", str(summary)])
    assert rc == 0
    s = json.loads(summary.read_text())
    assert s["kept"] == len(read_training_parquet(out)) == len(converted[0])
    assert s["n_bad"] == len(converted[1].bad)


def test_validation_split_is_held_out(tmp_path, repo_root, monkeypatch, release, release_config):
    """training.data.val_examples (paper: 100, authors' script): the last N usable records form verl's
    validation parquet and are not trained on."""
    monkeypatch.chdir(repo_root)
    out, val, summary = tmp_path / "t.parquet", tmp_path / "v.parquet", tmp_path / "s.json"
    rc = main(["data", "--config", release_config, "--out", str(out), "--val-out", str(val),
               "--summary", str(summary)])
    assert rc == 0
    train_ids = [e.uid for e in read_training_parquet(out)]
    val_ids = [e.uid for e in read_training_parquet(val)]
    n_val = load_config("config/smoke.yaml")["training"]["data"]["val_examples"]
    assert len(val_ids) == n_val and not set(train_ids) & set(val_ids)
    assert train_ids + val_ids == [e.uid for e in release[0]]
    assert json.loads(summary.read_text())["val_examples"] == n_val
