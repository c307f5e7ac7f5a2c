"""VitaBench adapter logic without the ``vita`` package: task parsing on fixtures, rubric judging from
given verdicts, episodes with stand-in tools / user / judge. ``test_real_vita.py`` runs the same adapter
on the real package where it is installed."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from envace.bench.tau2.user import ScriptedUserModel, UserTurn
from envace.bench.vitabench import adapter as vitabench_adapter
from envace.bench.vitabench import judge as vitabench_judge
from envace.bench.vitabench import tasks as vitabench_tasks
from envace.core.environment import Endpoint, EpisodeError, Services
from envace.core.tools import ToolCall

DATA = Path(__file__).resolve().parents[2] / "data" / "vitabench"


def test_fixture_tasks_parse():
    tasks = vitabench_tasks.load_task_file(DATA / "delivery" / "tasks_en.json", "delivery")
    assert [t.task_id for t in tasks] == ["fx-001", "fx-002"]
    first = tasks[0]
    # state rubrics first, then overall ones, each text once
    assert first.rubrics == (
        "The order contains plain noodles",
        "The order is delivered to the user's home",
        "The agent confirms the price before paying",
    )
    assert first.time == "2025-03-04 18:30:00" and first.user_profile["user id"] == "U900"
    assert tasks[1].rubrics == ()
    assert vitabench_tasks.task_file(DATA, "delivery", "english") == DATA / "delivery" / "tasks_en.json"
    assert vitabench_tasks.task_file(DATA, "ota", "chinese").name == "tasks.json"


def test_every_split_fixture_and_the_real_records_parse():
    for split in vitabench_tasks.SPLITS:  # hand-made, valid for vita's databases too (test_real_vita.py)
        tasks = vitabench_tasks.load_task_file(vitabench_tasks.task_file(DATA, split, "english"), split)
        assert tasks and all(t.split == split for t in tasks) and tasks[0].rubrics
    real = {
        split: vitabench_tasks.load_task_file(
            vitabench_tasks.task_file(DATA / "real", split, "english"), split
        )
        for split in ("delivery", "instore")
    }
    assert [t.task_id for t in real["delivery"]] == ["10711001", "G0721005"]
    assert [t.task_id for t in real["instore"]] == ["10826004"]
    first = real["delivery"][0]
    assert first.time == "2025-06-21 11:20:00" and len(first.rubrics) == 5  # state = overall rubrics


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t.pop("instructions"), "missing field 'instructions'"),
        (lambda t: t["environment"].pop("time"), "missing field 'time'"),
        (lambda t: t.update(user_scenario={"user_profile": "x"}), "'user_profile' must be"),
        (lambda t: t.update(message_history=[{"role": "user", "content": "hi"}]), "message_history"),
        (lambda t: t["evaluation_criteria"].update(overall_rubrics=[3]), "overall_rubrics must be strings"),
    ],
)
def test_malformed_tasks_are_clear_errors(tmp_path, mutate, message):
    data = json.loads((DATA / "delivery" / "tasks_en.json").read_text())
    mutate(data[0])
    path = tmp_path / "tasks_en.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message):
        vitabench_tasks.load_task_file(path, "delivery")


def test_file_level_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="task file not found"):
        vitabench_tasks.load_task_file(tmp_path / "none.json", "delivery")
    (tmp_path / "dup.json").write_text(
        json.dumps(json.loads((DATA / "delivery" / "tasks_en.json").read_text())[:1] * 2)
    )
    with pytest.raises(ValueError, match="duplicate"):
        vitabench_tasks.load_task_file(tmp_path / "dup.json", "delivery")
    with pytest.raises(ValueError, match="unknown VitaBench split"):
        vitabench_tasks.parse_task({}, "hotels")


def test_sliding_windows():
    assert vitabench_judge.sliding_windows(7) == [(0, 7)]
    assert vitabench_judge.sliding_windows(10) == [(0, 10)]
    assert vitabench_judge.sliding_windows(11) == [(0, 10), (8, 11)]
    assert vitabench_judge.sliding_windows(26) == [(0, 10), (8, 18), (16, 26)]
    assert vitabench_judge.sliding_windows(27) == [(0, 10), (8, 18), (16, 26), (24, 27)]
    spans = vitabench_judge.sliding_windows(100, 7, 3)
    assert spans[0] == (0, 7) and spans[-1][1] == 100
    assert all(b[0] == a[0] + 4 for a, b in zip(spans, spans[1:], strict=False))
    with pytest.raises(ValueError):
        vitabench_judge.sliding_windows(5, 2, 2)


def test_parse_judge_output_variants():
    answer = (
        'Here you go:\n```json\n[{"rubric_idx": "rubric_1", "justification": "ok", "meetExpectation": true},'
        ' {"rubric_idx": "rubric_9", "meetExpectation": true},'
        ' {"rubric_idx": 0, "meetExpectation": "false"}]\n```'
    )
    verdicts = vitabench_judge.parse_judge_output(answer, 3)
    assert verdicts == {
        1: vitabench_judge.Verdict(True, "ok"),
        0: vitabench_judge.Verdict(False, vitabench_judge.NO_JUSTIFICATION),
    }
    assert vitabench_judge.parse_judge_output(
        '{"results": [{"rubric_idx": "rubric_2", "meetExpectation": false}]}', 3
    ) == {2: vitabench_judge.Verdict(False, vitabench_judge.NO_JUSTIFICATION)}
    assert vitabench_judge.parse_judge_output("I cannot decide.", 3) is None
    assert (
        vitabench_judge.parse_judge_output('[{"rubric_idx": "rubric_0", "meetExpectation": "maybe"}]', 3)
        == {}
    )
    # no meetExpectation: an update of the justification only (vita keeps the state)
    assert vitabench_judge.parse_judge_output('[{"rubric_idx": "rubric_1", "justification": "j"}]', 3) == {
        1: vitabench_judge.Verdict(None, "j")
    }


def test_broken_judge_json_is_repaired_only_with_json_repair(monkeypatch):
    broken = '[{"rubric_idx": "rubric_0", "meetExpectation": true},]'
    monkeypatch.setitem(sys.modules, "json_repair", None)  # not installed: unreadable
    assert vitabench_judge.parse_judge_output(broken, 1) is None
    calls = []

    def repair_json(text):  # a stand-in repair that drops trailing commas
        calls.append(text)
        return re.sub(r",\s*([\]}])", r"\1", text)

    monkeypatch.setitem(sys.modules, "json_repair", SimpleNamespace(repair_json=repair_json))
    assert vitabench_judge.parse_judge_output(broken, 1) == {
        0: vitabench_judge.Verdict(True, vitabench_judge.NO_JUSTIFICATION)
    }
    assert calls == [broken]
    assert (
        vitabench_judge.parse_judge_output('[{"rubric_idx": "rubric_0", "meetExpectation": false}]', 1)
        == {0: vitabench_judge.Verdict(False, vitabench_judge.NO_JUSTIFICATION)}
        and len(calls) == 1
    )  # valid JSON never goes through the repair


def test_scoring_from_given_verdicts():
    rubrics = ["a", "b", "c", "d"]
    states = [vitabench_judge.Verdict(False, "")] * 4
    states = vitabench_judge.apply_verdicts(
        states, {0: vitabench_judge.Verdict(True, "x"), 1: vitabench_judge.Verdict(True, "y")}
    )
    states = vitabench_judge.apply_verdicts(states, None)  # unparsable window keeps the states
    states = vitabench_judge.apply_verdicts(
        states, {1: vitabench_judge.Verdict(False, "later window"), 2: vitabench_judge.Verdict(True, "z")}
    )
    states = vitabench_judge.apply_verdicts(
        states, {0: vitabench_judge.Verdict(None, "kept")}
    )  # no verdict: the state stays
    assert states[0] == vitabench_judge.Verdict(True, "kept")
    score = vitabench_judge.score_from_verdicts(rubrics, states)
    assert score.score == 0.0 and score.subscores == {"rubric_fraction": 0.5}
    assert score.extra["rubric_checks"][1] == {"rubric": "b", "met": False, "justification": "later window"}
    all_met = vitabench_judge.score_from_verdicts(rubrics, [vitabench_judge.Verdict(True, "")] * 4)
    assert all_met.score == 1.0 and all_met.subscores == {"rubric_fraction": 1.0}
    assert vitabench_judge.score_from_verdicts([], []).score == 1.0
    with pytest.raises(ValueError):
        vitabench_judge.score_from_verdicts(rubrics, states[:2])


def test_format_transcript():
    records = [
        {"role": "assistant", "content": "Hello"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "find", "arguments": {"q": "noodles"}}]},
        {"role": "tool", "content": "[]"},
        {"role": "user", "content": ""},
    ]
    assert (
        vitabench_judge.format_transcript(records, 4)
        == "[5] assistant: Hello\n[6] assistant: find(q='noodles')\n[7] tool: []"
    )


class _Tools:
    """A stand-in tool environment with one tool."""

    def __init__(self):
        self.calls = []

    def execute(self, name, arguments):
        self.calls.append((name, arguments))
        if name != "search_stores":
            return f"Error: unknown tool {name}", True
        if set(arguments) != {"keyword"}:
            return "Error: search_stores() needs exactly 'keyword'", True
        return json.dumps([{"store_id": "S1", "name": "Test Noodle Bar"}]), False


def _adapter(user_turns, judge_answers, judge_log):
    answers = iter(judge_answers)

    def judge_factory(_task, _services):
        def complete(messages):
            judge_log.append(messages)
            return next(answers)

        return complete

    return vitabench_adapter.VitaBenchAdapter(
        data_dir=DATA,
        tool_backend_factory=lambda _t: _Tools(),
        user_model_factory=lambda _t, _s: ScriptedUserModel(user_turns),
        judge_factory=judge_factory,
        system_factory=lambda t: (
            f"agent policy at {t.time}",
            [{"type": "function", "function": {"name": "search_stores"}}],
            f"user persona {t.user_profile}",
        ),
        judge_prompt_factory=lambda t, i, n: f"judge {i}/{n}: {t.instructions}",
    )


def test_episode_with_stand_ins_scores_from_judge_verdicts():
    judge_log = []
    verdict = json.dumps(
        [{"rubric_idx": f"rubric_{k}", "justification": "seen", "meetExpectation": k != 2} for k in range(3)]
    )
    adapter = _adapter(
        [UserTurn("I want noodles."), UserTurn("Yes, thanks ###STOP###")], [verdict], judge_log
    )
    tasks = adapter.load_tasks(["delivery"], 1)
    assert len(tasks) == 1 and tasks[0].task_id == "delivery/fx-001"
    assert tasks[0].system == "agent policy at 2025-03-04 18:30:00" and tasks[0].first_user == ""
    episode = adapter.new_episode(tasks[0], 0, 0, Services())
    assert episode.first_user_message() == "I want noodles."
    assert "Test Noodle Bar" in episode.step(ToolCall("search_stores", {"keyword": "noodles"}))
    assert episode.step(ToolCall("rm", {"path": "/"})).startswith("Error:")
    assert episode.step(ToolCall("search_stores", {"keyword": 1, "x": 2})).startswith("Error:")
    assert episode.user_reply("Plain noodles are 12. Shall I order?") is None
    assert (
        episode.step(ToolCall("search_stores", {"keyword": "late"})) == "Error: the conversation has ended."
    )
    score = episode.score()
    assert score.score == 0.0 and score.subscores["rubric_fraction"] == pytest.approx(2 / 3)
    assert score.extra["num_tool_errors"] == 2 and score.extra["user_stopped"] is True
    system, user = judge_log[0]
    assert system["content"].startswith("judge 1/1: Order one bowl")
    assert "[1] assistant: Hello, how can I help you?" in user["content"]
    assert (
        "search_stores(keyword='noodles')" in user["content"]
        and '"rubric_idx": "rubric_2"' in user["content"]
    )
    assert episode.user_chat[0]["content"].startswith("user persona")


def test_long_conversation_is_judged_in_windows_and_later_verdicts_win():
    judge_log = []
    first = json.dumps(
        [
            {"rubric_idx": "rubric_0", "meetExpectation": True},
            {"rubric_idx": "rubric_1", "meetExpectation": True},
        ]
    )
    second = json.dumps([{"rubric_idx": "rubric_1", "meetExpectation": False, "justification": "changed"}])
    turns = [UserTurn("hi")] + [UserTurn(f"more {i}") for i in range(5)] + [UserTurn("bye ###STOP###")]
    adapter = _adapter(turns, [first, second, "unreadable"], judge_log)
    task = adapter.load_tasks(["delivery"], None)[0]
    episode = adapter.new_episode(task, 0, 0, Services())
    episode.first_user_message()
    reply = ""
    while reply is not None:
        episode.step(ToolCall("search_stores", {"keyword": "x"}))
        reply = episode.user_reply("anything else?")
    score = episode.score()
    assert len(judge_log) == len(vitabench_judge.sliding_windows(len(episode.records))) == 3
    assert score.subscores == {"rubric_fraction": pytest.approx(1 / 3)} and score.score == 0.0
    assert [c["met"] for c in score.extra["rubric_checks"]] == [True, False, False]
    assert score.extra["rubric_checks"][1]["justification"] == "changed"
    assert score.extra["judge_unparsed_windows"] == 1
    second_window = judge_log[1][1]["content"]
    assert "[9] " in second_window and "[8] " not in second_window  # windows of 10 overlapping by 2
    assert '"meetExpectation": true' in second_window  # the states of the first window are passed on


def test_tool_errors_are_counted_but_do_not_zero_the_score():
    # vita's orchestrator declares max_errors=10 but never counts errors: the judge alone decides
    judge_log = []
    verdict = json.dumps([{"rubric_idx": f"rubric_{k}", "meetExpectation": True} for k in range(3)])
    adapter = _adapter([UserTurn("hi"), UserTurn("###STOP###")], [verdict] * 4, judge_log)
    task = adapter.load_tasks(["delivery"], 1)[0]
    episode = adapter.new_episode(task, 0, 0, Services())
    episode.first_user_message()
    for _ in range(12):
        episode.step(ToolCall("nope", {}))
    assert episode.user_reply("Sorry.") is None
    score = episode.score()
    assert score.score == 1.0 and score.extra["num_tool_errors"] == 12
    assert len(judge_log) == len(vitabench_judge.sliding_windows(len(episode.records))) == 4


def test_agent_stop_token_ends_the_conversation_without_asking_the_user():
    judge_log = []
    user = ScriptedUserModel([UserTurn("I want noodles."), UserTurn("should never be asked")])
    adapter = _adapter([], ["[]"], judge_log)
    adapter.user_model_factory = lambda _t, _s: user
    task = adapter.load_tasks(["delivery"], 1)[0]
    episode = adapter.new_episode(task, 0, 0, Services())
    episode.first_user_message()
    assert episode.user_reply("All done. ###STOP###") is None
    assert len(user.seen) == 1  # only the opening was asked for
    assert episode.user_reply("more?") is None
    assert episode.step(ToolCall("search_stores", {"keyword": "x"})) == "Error: the conversation has ended."
    score = episode.score()
    assert score.extra["agent_stopped"] is True and score.extra["user_stopped"] is False
    assert "All done. ###STOP###" in judge_log[0][1]["content"]  # the stop message is judged too


def test_missing_services_and_package_are_clear_errors():
    adapter = vitabench_adapter.VitaBenchAdapter(
        data_dir=DATA, tool_backend_factory=lambda _t: _Tools(), system_factory=lambda t: ("s", [], "u")
    )
    task = adapter.load_tasks(["delivery"], 1)[0]
    with pytest.raises(EpisodeError, match="user simulator endpoint"):
        adapter.new_episode(task, 0, 0, Services())
    episode = adapter.new_episode(task, 0, 0, Services(user_simulator=Endpoint("http://x/v1", "u")))
    with pytest.raises(EpisodeError, match="judge endpoint"):
        episode.score()
    try:
        import vita  # noqa: F401
    except ImportError:
        real = vitabench_adapter.VitaBenchAdapter(data_dir=DATA)
        with pytest.raises(EpisodeError, match=re.escape(f"vitabench@{vitabench_tasks.VITABENCH_COMMIT}")):
            real.load_tasks(["delivery"], 1)
    with pytest.raises(ValueError, match="data_dir"):
        vitabench_adapter.VitaBenchAdapter().load_tasks(["delivery"], 1)
    with pytest.raises(ValueError, match="language"):
        vitabench_adapter.VitaBenchAdapter(language="klingon")


def test_openai_judge_with_stand_in_client():
    requests = []

    def create(**kwargs):
        requests.append(kwargs)
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content="[]"))])

    client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
    judge = vitabench_judge.OpenAIJudge(Endpoint("http://x/v1", "judge-llm"), temperature=0.0, client=client)
    assert judge([{"role": "user", "content": "q"}]) == "[]"
    assert requests[0]["model"] == "judge-llm" and requests[0]["temperature"] == 0.0


def test_versions_record_data_and_models():
    adapter = _adapter([], [], [])
    adapter.user_simulator, adapter.judge_model = "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B"
    v = adapter.versions()
    digest = hashlib.sha256()
    for split in ("delivery", "instore", "ota", "cross_domain"):  # every split present, in SPLITS order
        digest.update(split.encode() + b"\n" + (DATA / split / "tasks_en.json").read_bytes())
    assert v["vitabench_data_sha256"] == digest.hexdigest()
    assert vitabench_adapter.VitaBenchAdapter().versions()["vitabench_data_sha256"] == "no data_dir"
    assert v["judge"] == "Qwen/Qwen3-30B-A3B"
    assert v["judge_window"] == "10/2" and v["language"] == "english"


def test_episode_requires_the_opening_first():
    adapter = _adapter([UserTurn("hi")], [], [])
    task = adapter.load_tasks(["delivery"], 1)[0]
    episode = adapter.new_episode(task, 0, 0, Services())
    with pytest.raises(EpisodeError, match="first_user_message"):
        episode.step(ToolCall("search_stores", {"keyword": "x"}))
    assert episode.first_user_message() == "hi" == episode.first_user_message()  # asked once
