"""The Ledger benchmark (envace.bench.ledger): tools, task generation, scoring, reference records."""

from __future__ import annotations

import json
import re

import pytest

from envace.bench.ledger import (
    TOOLS,
    Ledger,
    LedgerAdapter,
    generate_tasks,
    reference_record,
    score_episode,
    world_records,
    write_records,
)
from envace.core.environment import Services
from envace.core.tools import ToolCall, parse_tool_calls
from envace.train.data import normalize_record, record_layout


def test_tools_change_state_only_through_valid_calls():
    led = Ledger({"alice": 50, "bob": 10})
    balance = json.loads(led.call(ToolCall("get_balance", {"account": "bob"})))
    assert balance == {"account": "bob", "balance": 10}
    assert json.loads(led.call(ToolCall("transfer", {"source": "alice", "target": "bob", "amount": 20}))) == {
        "ok": True, "source_balance": 30, "target_balance": 30}
    bad = [ToolCall("rm", {}), ToolCall("get_balance", {}), ToolCall("get_balance", {"account": 3}),
           ToolCall("get_balance", {"account": "zed"}),
           ToolCall("transfer", {"source": "alice", "target": "bob", "amount": True}),
           ToolCall("transfer", {"source": "alice", "target": "bob", "amount": 0}),
           ToolCall("transfer", {"source": "alice", "target": "bob", "amount": 31}),
           ToolCall("transfer", {"source": "bob", "target": "bob", "amount": 1}),
           ToolCall("transfer", {"source": "alice", "target": "bob", "amount": 1, "memo": "x"})]
    for call in bad:
        assert "error" in json.loads(led.call(call)), call
    assert led.balances == {"alice": 30, "bob": 30}


def test_tasks_are_seeded_disjoint_and_solved_by_their_reference_calls():
    a, b = generate_tasks(3, 40, 20), generate_tasks(3, 40, 20)
    assert a == b and generate_tasks(4, 40, 20) != a
    assert {t.key() for t in a["train"]}.isdisjoint(t.key() for t in a["test"])
    assert {t.kind for t in a["train"]} == {"balance", "transfer"}
    for task in a["train"] + a["test"]:
        led = Ledger(dict(task.initial))
        for call in task.calls:
            assert "error" not in json.loads(led.call(call))
        assert score_episode(task, led, f"It is {task.answer}.").score == 1.0
        assert score_episode(task, led, "I do not know.").subscores == {"state": 1.0, "answer": 0.0}
        # the last number counts: a list of guesses that holds the answer elsewhere does not pass
        assert score_episode(task, led, f"{task.answer} or {task.answer + 1}").subscores["answer"] == 0.0


def test_stated_balances_make_every_observation_a_function_of_the_question():
    """``show_balances``: the same tasks, each question stating every balance, so a get_balance result
    copies a stated number and a transfer result is the stated numbers plus or minus the amount."""
    plain, stated = generate_tasks(2, 30, 10), generate_tasks(2, 30, 10, show_balances=True)
    for a, b in zip(plain["train"] + plain["test"], stated["train"] + stated["test"], strict=True):
        assert a.key() == b.key() and a.answer == b.answer and b.question.endswith(a.question)
        shown = dict(re.findall(r'"(\w+)" (\d+)', b.question.split(". ")[0]))
        assert {k: int(v) for k, v in shown.items()} == b.initial
        observation = json.loads(Ledger(dict(b.initial)).call(b.calls[0]))
        if b.kind == "balance":
            assert str(observation["balance"]) in shown.values()
        else:
            amount = b.calls[0].arguments["amount"]
            assert observation["target_balance"] == int(shown[b.calls[0].arguments["target"]]) + amount
        # the checklist names the question, not the statement
        assert "Balances" not in json.dumps(reference_record(b)["checklists"])
    adapter = LedgerAdapter({"ledger": {"seed": 2, "n_train": 30, "n_test": 10, "show_balances": True}})
    assert adapter.load_tasks(["test"], 1)[0].first_user.startswith("Balances: ")
    assert "balances stated" in adapter.versions()["ledger"]


def test_a_transfer_left_undone_fails_the_state_check():
    task = next(t for t in generate_tasks(0, 20, 0)["train"] if t.kind == "transfer")
    s = score_episode(task, Ledger(dict(task.initial)), str(task.answer))
    assert s.score == 0.0 and s.subscores == {"state": 0.0, "answer": 1.0}


def test_reference_record_is_cm2_shaped_and_replays_in_an_episode():
    task = generate_tasks(1, 4, 0)["train"][0]
    rec = reference_record(task)
    assert rec["tools"] == TOOLS and [m["role"] for m in rec["messages"]][:2] == ["system", "user"]
    assert abs(sum(i["weight"] for i in rec["checklists"][0][0]) - 1.0) < 1e-9
    example = normalize_record(rec, 0)  # what `envace data` reads: CM2's labelled layout
    assert record_layout(rec) == "cm2_labelled" and example.uid == task.task_id
    adapter = LedgerAdapter({"ledger": {"seed": 1, "n_train": 4, "n_test": 2}})
    (t,) = [x for x in adapter.load_tasks(["train"], None) if x.task_id == task.task_id]
    ep = adapter.new_episode(t, 0, 0, Services())
    for msg, nxt in zip(rec["messages"], rec["messages"][1:], strict=False):
        for tc in msg.get("tool_calls", []):
            call = ToolCall(tc["function"]["name"], json.loads(tc["function"]["arguments"]))
            assert ep.step(call) == nxt["content"]
    assert ep.user_reply(rec["messages"][-1]["content"]) is None and ep.score().score == 1.0


def test_adapter_splits_limits_and_unknown_split():
    adapter = LedgerAdapter({"ledger": {"seed": 0, "n_train": 6, "n_test": 3}})
    assert len(adapter.load_tasks(["train", "test"], 2)) == 4
    with pytest.raises(ValueError, match="unknown split"):
        adapter.load_tasks(["dev"], None)


def test_model_text_reaches_only_the_whitelisted_methods():
    led = Ledger({"alice": 5})
    parsed = parse_tool_calls('<tool_call>\n{"name": "__init__", "arguments": {}}\n</tool_call>')
    assert "unknown tool" in led.call(parsed.calls[0])
    assert "unknown tool" in led.call(ToolCall("_transfer", {"source": "a", "target": "b", "amount": 1}))


def test_write_records_round_trips(tmp_path):
    tasks = generate_tasks(2, 5, 0)["train"]
    out = tmp_path / "d" / "ledger.jsonl"
    write_records(tasks, out)
    lines = out.read_text().splitlines()
    assert [json.loads(x)["uuid"] for x in lines] == [t.task_id for t in tasks]
    assert not list(out.parent.glob("*.tmp"))


def test_world_records_probe_every_account_with_the_real_observation(tmp_path):
    """One record per account of the task's initial state: the task's question, a get_balance call on that
    account, the real ledger's observation; with stated balances each is a number the question states.
    Their reference call is what the warm start rehearses (normalised as any CM2 record)."""
    task = generate_tasks(0, 3, 0, show_balances=True)["train"][0]
    records = world_records(task)
    assert [r["uuid"] for r in records] == [f"{task.task_id}-{a}" for a in sorted(task.initial)]
    for account, record in zip(sorted(task.initial), records, strict=True):
        assert record["messages"][1]["content"] == task.question
        example = normalize_record(record, 0)
        assert example.reference_calls == [{"name": "get_balance", "arguments": {"account": account}}]
        observation = json.loads(record["messages"][-1]["content"])
        assert observation == {"account": account, "balance": task.initial[account]}
        assert f'"{account}" {task.initial[account]}' in task.question
    out = tmp_path / "world.jsonl"
    write_records([task], out, world=True)
    assert [json.loads(x)["uuid"] for x in out.read_text().splitlines()] == [r["uuid"] for r in records]


def test_gold_replays_through_the_evaluation_runner(tmp_path):
    """Each task's reference calls, as model text, through the runner's parser, rollout and scorer."""
    from envace.bench.scripted import script_for_calls
    from envace.bench.selfcheck import replay_gold

    adapter = LedgerAdapter({"ledger": {"seed": 5, "n_train": 4, "n_test": 4}})
    tasks = adapter.load_tasks(["test"], None)
    scripts = {t.task_id: script_for_calls([list(t.meta["ledger_task"].calls)],
                                           f"The balance is {t.meta['ledger_task'].answer}.") for t in tasks}
    passed, total, failed = replay_gold(adapter, tasks, scripts, "ledger", tmp_path)
    assert (passed, total) == (4, 4), failed
    wrong = {t.task_id: script_for_calls([[]], "The balance is -1.") for t in tasks}
    assert replay_gold(adapter, tasks, wrong, "ledger_wrong", tmp_path)[0] == 0


def test_selfcheck_command_replays_every_task(capsys):
    """``envace selfcheck ledger``: every task of both splits (default generator) passes its gold replay."""
    from envace.cli.main import main

    assert main(["selfcheck", "ledger"]) == 0
    out = capsys.readouterr().out
    assert "train: 64/64" in out and "test: 32/32" in out and "96/96" in out


def test_observation_spelling_is_the_warm_starts():
    """An observation is spelled as json.dumps spells the parsed reference response (what the warm
    start's answer rows show the model), so evaluation shows the model the spelling it trained on."""
    obs = Ledger({"alice": 50, "bob": 10}).call(ToolCall("get_balance", {"account": "bob"}))
    assert obs == json.dumps(json.loads(obs))


def test_ledger_records_command_reads_the_configs_generator(tmp_path, repo_root, capsys):
    """``envace ledger-records``: the split's records of ``benchmarks.ledger.ledger`` (seed, sizes), written
    atomically; an unknown key in that entry is a config error naming it."""
    import yaml

    from envace.cli.main import main

    cfg = yaml.safe_load((repo_root / "config/smoke.yaml").read_text())
    cfg["benchmarks"]["ledger"] = {"package": "envace", "splits": ["test"],
                                   "ledger": {"seed": 3, "n_train": 5, "n_test": 2},
                                   "aggregate": {"metric": "score",
                                                 "groups": {"test": {"weight": 1, "splits": ["test"]}}}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "train.jsonl"
    assert main(["ledger-records", "--config", str(path), "--split", "train", "--out", str(out)]) == 0
    ids = [json.loads(x)["uuid"] for x in out.read_text().splitlines()]
    assert ids == [t.task_id for t in generate_tasks(3, 5, 2)["train"]]
    world = tmp_path / "world.jsonl"
    assert main(["ledger-records", "--config", str(path), "--split", "world", "--out", str(world)]) == 0
    assert [json.loads(x)["uuid"] for x in world.read_text().splitlines()] == [
        r["uuid"] for t in generate_tasks(3, 5, 2)["train"] for r in world_records(t)]
    cfg["benchmarks"]["ledger"]["ledger"]["n_tasks"] = 4
    path.write_text(yaml.safe_dump(cfg))
    assert main(["ledger-records", "--config", str(path), "--out", str(tmp_path / "x.jsonl")]) == 1
    assert "benchmarks.ledger.ledger" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()
