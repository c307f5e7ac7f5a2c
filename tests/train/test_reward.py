"""Reward rules (hand-computed) and the judge client against a local fake OpenAI-compatible server."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from envace.core.reward import (
    EMPTY_RESPONSE_REWARD,
    RewardRules,
    checklist_reward,
    reference_match_reward,
)
from envace.train.judge import ChecklistJudge, JudgeConfig, parse_verdict


# ----------------------------------------------------------------------------------------- fixtures
def _call(name, **args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


USER = {"role": "user", "content": "weather in Paris, then add 2 and 3"}
STEP1 = {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", city="Paris")]}
OBS_OK = {"role": "tool", "content": json.dumps({"temperature": 20})}
OBS_ERR = {"role": "tool", "content": json.dumps({"error": "INVALID_PARAMETERS", "message": "x"})}
FINAL = {"role": "assistant", "content": "It is 20 degrees."}
ITEMS = [{"id": "a", "question": "called get_weather?", "weight": 0.6},
         {"id": "b", "question": "stated the temperature?", "weight": 0.4}]


class _Completions:
    """Stand-in for ``client.chat.completions``: a function of (step text, question) gives the reply."""

    def __init__(self, decide):
        self.decide = decide
        self.calls = 0

    def create(self, **kw):
        self.calls += 1
        self.last = kw
        user = kw["messages"][1]["content"]
        step = user.split("(the step to judge)")[1].split("# Checklist item")[0]
        question = user.split("Question: ")[1].split("\n")[0]
        content = self.decide(step, question)
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=content))])


def _judge(decide, **cfg):
    completions = _Completions(decide)
    client = SimpleNamespace(chat=SimpleNamespace(completions=completions))
    judge = ChecklistJudge(JudgeConfig(base_url="http://unused", model="judge", max_concurrency=1, **cfg),
                           client=client, sleep=lambda s: None)
    return judge, completions


def _by_rule(step: str, question: str) -> str:
    """Item a passes at a step with a get_weather call; item b at a step that states '20 degrees'."""
    ok = ("get_weather" in step) if "get_weather" in question else ("20 degrees" in step)
    return json.dumps({"passed": ok, "reason": "rule"})


# ------------------------------------------------------------------------------------- reward rules
def test_item_passes_if_it_passes_at_any_step():
    judge, completions = _judge(_by_rule)
    res = checklist_reward([USER, STEP1, OBS_OK, FINAL], [ITEMS], judge)
    # a passes at step 1, b at step 2 -> 0.6 + 0.4
    assert res.reward == pytest.approx(1.0)
    assert completions.calls == 2 * len(ITEMS)


def test_partial_turn_is_sum_of_passed_weights():
    judge, _ = _judge(_by_rule)
    res = checklist_reward([USER, STEP1, OBS_OK, {"role": "assistant", "content": "done"}], [ITEMS], judge)
    assert res.reward == pytest.approx(ITEMS[0]["weight"])


def test_tool_failure_zeroes_the_turn():
    judge, _ = _judge(_by_rule)
    res = checklist_reward([USER, STEP1, OBS_ERR, FINAL], [ITEMS], judge)
    assert res.reward == 0.0


def test_episode_is_mean_over_turns():
    judge, _ = _judge(_by_rule)
    second = [{"role": "user", "content": "thanks"}, {"role": "assistant", "content": "bye"}]
    res = checklist_reward([USER, STEP1, OBS_OK, FINAL, *second], [ITEMS, ITEMS], judge)
    assert res.turn_scores == pytest.approx([1.0, 0.0])
    assert res.reward == pytest.approx(0.5)


def test_empty_response_gets_minus_point_one_without_judge():
    """empty_response_penalty="episode" (ours before; the per-row default is in test_reward_rules.py)."""
    judge, completions = _judge(_by_rule)
    episode = RewardRules(empty_response_penalty="episode")
    res = checklist_reward([USER, {"role": "assistant", "content": "  "}], [ITEMS], judge, episode)
    assert res.reward == EMPTY_RESPONSE_REWARD == -0.1
    assert completions.calls == 0
    assert reference_match_reward([USER, {"role": "assistant", "content": ""}], [], episode).reward == -0.1


def test_verdict_cache_avoids_repeated_calls():
    judge, completions = _judge(_by_rule)
    checklist_reward([USER, STEP1, OBS_OK, FINAL], [ITEMS], judge)
    n = completions.calls
    checklist_reward([USER, STEP1, OBS_OK, FINAL], [ITEMS], judge)
    assert completions.calls == n
    assert judge.metrics.cache_hits == n


def _fail_b(step, question):
    return "not json" if "temperature" in question else _by_rule(step, question)


@pytest.mark.parametrize("policy, expected", [
    ("fail", 0.6),          # b never passes
    ("skip_item", 1.0),     # b removed; a's weight rescaled to 1
    ("drop_sample", None),  # no reward
])
def test_failure_policies(policy, expected):
    judge, _ = _judge(_fail_b, failure_policy=policy, max_retries=1)
    res = checklist_reward([USER, STEP1, OBS_OK, FINAL], [ITEMS], judge)
    assert res.reward == (pytest.approx(expected) if expected is not None else None)
    assert res.failures == 2  # b at both steps
    assert judge.metrics.failures == 2
    assert judge.metrics.malformed == 4  # 2 verdicts x (1 try + 1 retry)
    assert judge.metrics.retries == 2


@pytest.mark.parametrize("text, verdict", [
    ('{"passed": true, "reason": "x"}', True),
    ('<think>hmm</think>\n {"passed": false}', False),
    ('```json\n{"passed": true}\n```', None),
    ('{"passed": "yes"}', None),
    ('Sure! {"passed": true}', None),
    (None, None),
])
def test_parse_verdict_is_strict(text, verdict):
    assert parse_verdict(text) == verdict


def test_reference_match():
    ref = [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    exact = reference_match_reward([USER, STEP1, OBS_OK, FINAL], ref).reward
    rome = {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", city="Rome")]}
    wrong_args = reference_match_reward([USER, rome], ref).reward
    no_call = reference_match_reward([USER, FINAL], ref).reward
    two = [USER, {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", city="Paris"),
                                                                    _call("add", a=1, b=2)]}]
    assert exact == 1.0
    assert wrong_args == 0.5  # name only: precision = recall = 0.5
    assert no_call == 0.0
    assert reference_match_reward(two, ref).reward == pytest.approx(2 * 0.5 * 1.0 / 1.5)


# ------------------------------------------------------------------------------ fake OpenAI server
class _FakeServer:
    """An OpenAI-compatible ``/v1/chat/completions`` that plays a script of replies:
    ``("json", text)`` -> 200 with that content; ``("sleep", s)`` -> wait, then a valid reply;
    ``("http", code)`` -> that status; ``("garbage", body)`` -> 200 with a non-JSON body."""

    def __init__(self, script):
        self.script = list(script)
        self.hits = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                json.loads(self.rfile.read(length))
                outer.hits += 1
                kind, value = outer.script.pop(0) if outer.script else ("json", '{"passed": true}')
                if kind == "sleep":
                    time.sleep(value)
                    kind, value = "json", '{"passed": true}'
                if kind == "http":
                    self._send(value, json.dumps({"error": {"message": "boom"}}).encode())
                elif kind == "garbage":
                    self._send(200, value.encode())
                else:
                    body = {"id": "x", "object": "chat.completion", "created": 0, "model": "judge",
                            "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": value}}]}
                    self._send(200, json.dumps(body).encode())

            def _send(self, code, body):
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server_factory():
    servers = []

    def make(script):
        servers.append(_FakeServer(script))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def _http_judge(url, **kw):
    cfg = dict(base_url=url, model="judge", timeout_s=0.5, backoff_s=0.0, max_concurrency=1)
    cfg.update(kw)
    return ChecklistJudge(JudgeConfig(**cfg))


def _msgs(tag="x"):
    return [{"role": "system", "content": "s"}, {"role": "user", "content": tag}]


def test_http_malformed_then_valid_is_retried(server_factory):
    srv = server_factory([("json", "no json here"), ("garbage", "<html>"), ("json", '{"passed": false}')])
    judge = _http_judge(srv.url, max_retries=3)
    assert judge.verdict(_msgs()) is False
    assert srv.hits == 3
    assert judge.metrics.malformed == 1 and judge.metrics.errors == 1 and judge.metrics.retries == 2
    assert judge.metrics.failures == 0


def test_http_timeout_then_success(server_factory):
    srv = server_factory([("sleep", 1.5), ("json", '{"passed": true}')])
    judge = _http_judge(srv.url, max_retries=2)
    assert judge.verdict(_msgs()) is True
    assert judge.metrics.timeouts == 1


def test_http_errors_exhaust_retries(server_factory):
    srv = server_factory([("http", 500), ("http", 503), ("json", "bad")])
    judge = _http_judge(srv.url, max_retries=2)
    assert judge.verdict(_msgs()) is None
    assert srv.hits == 3
    assert judge.metrics.failures == 1 and judge.metrics.errors == 2 and judge.metrics.malformed == 1


def test_http_cache_persisted(server_factory, tmp_path):
    srv = server_factory([("json", '{"passed": true}')])
    cache = tmp_path / "verdicts.jsonl"
    assert _http_judge(srv.url, cache_path=str(cache)).verdict(_msgs("k")) is True
    fresh = _http_judge(srv.url, cache_path=str(cache))
    assert fresh.verdict(_msgs("k")) is True
    assert srv.hits == 1 and fresh.metrics.cache_hits == 1


def test_verl_compute_score_entry_point(server_factory, monkeypatch):
    """verl's custom-reward signature: the judge comes from the environment, checklists from ground_truth."""
    import envace.train.reward_fn as rw

    srv = server_factory([("json", '{"passed": false}')] * 4)  # requests run concurrently: same reply
    monkeypatch.setattr(rw, "_PROCESS_JUDGE", None)
    monkeypatch.setenv("ENVACE_JUDGE_BASE_URL", srv.url)
    monkeypatch.setenv("ENVACE_JUDGE_MODEL", "judge")
    extra = {"messages": [USER, STEP1, OBS_OK, FINAL], "reference_calls": json.dumps([])}
    out = rw.compute_score("cm2", "It is 20 degrees.", json.dumps([ITEMS]), extra)
    assert out == {"score": 0.0, "judge_failures": 0, "judge_verdicts": 4, "dropped": False}
    assert srv.hits == 4  # 2 steps x 2 items
    monkeypatch.setenv("ENVACE_REWARD", "reference_match")
    extra["reference_calls"] = json.dumps([{"name": "get_weather", "arguments": {"city": "Paris"}}])
    assert rw.compute_score("cm2", "", None, extra)["score"] == 1.0


def test_judge_request_is_the_authors_strict_json_schema_with_6000_tokens():
    from envace.train.judge import VERDICT_FORMAT

    judge, completions = _judge(_by_rule)
    checklist_reward([USER, STEP1, OBS_OK, FINAL], [ITEMS], judge)
    assert completions.last["max_tokens"] == 6000
    assert completions.last["response_format"] == VERDICT_FORMAT
    assert VERDICT_FORMAT["json_schema"]["strict"] is True
    judge, completions = _judge(_by_rule, json_schema=False, max_tokens=64)
    checklist_reward([USER, STEP1, OBS_OK, FINAL], [ITEMS], judge)
    assert "response_format" not in completions.last and completions.last["max_tokens"] == 64


def test_verl_workers_get_the_configured_judge(repo_root):
    """training.judge -> ENVACE_JUDGE_* (launch) -> the reward worker's JudgeConfig (reward)."""
    from envace.common.config import load_config
    from envace.train.judge import judge_config_from_env
    from envace.train.verl_ext.launch import judge_env

    cfg = load_config(repo_root / "config" / "config.yaml")
    jc = judge_config_from_env(judge_env(cfg, "http://judge:1/v1", "Qwen/Qwen3-30B-A3B"))
    j = cfg["training"]["judge"]
    assert (jc.base_url, jc.model, jc.temperature, jc.top_p) == ("http://judge:1/v1", j["model"], 0.6, 0.8)
    assert (jc.max_tokens, jc.json_schema, jc.max_retries) == (6000, True, j["max_retries"])


def test_judge_settings_travel_from_the_config_to_the_reward_worker():
    """training.judge -> ENVACE_JUDGE_* (the launcher) -> JudgeConfig (the reward worker), concurrency too."""
    from envace.train.judge import judge_config_from_env
    from envace.train.verl_ext.launch import judge_env

    judge = {"model": "j", "temperature": 0.3, "top_p": 0.7, "max_tokens": 99, "max_retries": 1,
             "timeout_s": 5, "failure_policy": "skip_item", "max_concurrency": 4, "json_schema": False,
             "reason_max_chars": 12}
    got = judge_config_from_env(judge_env({"training": {"judge": judge}}, "http://u/v1", "j"))
    assert (got.temperature, got.top_p, got.max_tokens) == (0.3, 0.7, 99)
    assert (got.max_retries, got.timeout_s) == (1, 5)
    assert (got.failure_policy, got.max_concurrency, got.json_schema, got.reason_max_chars) == \
        ("skip_item", 4, False, 12)
    assert (got.base_url, got.model) == ("http://u/v1", "j")
