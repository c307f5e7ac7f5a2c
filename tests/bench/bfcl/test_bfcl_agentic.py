"""BFCL-v4 agentic categories: memory chains through bfcl-eval's own backends, web search from a recorded
cache or live (guarded), bfcl-eval's agentic checker, gold replay through the full runner."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import sys
from pathlib import Path
from unittest import mock

import pytest

from envace.bench.bfcl.adapter import BfclMultiTurnAdapter, BfclV4Adapter
from envace.bench.bfcl.agentic import gold_answer, load_agentic_tasks, prerequisite_stages
from envace.bench.bfcl.common import AGENTIC_SPLITS
from envace.bench.bfcl.memory import HashingEncoder, load_encoder, memory_backend_class, memory_system_prompt
from envace.bench.bfcl.web import ResponseCache, UnsafeURLError, WebBackend, guarded_get, web_search_api_class
from envace.bench.runner import prerequisite_path, run_samples
from envace.bench.scripted import CharTokenizer, ScriptedBackend, script_for_calls
from envace.bench.selfcheck import REPLAY_CONFIG, selfcheck_bfcl_agentic
from envace.common.results import read_results
from envace.core.environment import Services
from envace.core.episode import run_episode
from envace.core.tools import ToolCall

CACHE = Path(__file__).resolve().parents[2] / "data" / "bfcl_web_search" / "cache.jsonl"


def _adapter(tmp_path: Path, **web) -> BfclV4Adapter:
    config = {"splits": list(AGENTIC_SPLITS), "memory": {"encoder": "hashing", "scenarios": ["notetaker"]},
              "web_search": {"mode": "replay", "cache": str(CACHE), **web}}
    return BfclV4Adapter(config, work_dir=tmp_path / "work")


def _run(adapter, tasks, scripts, out, samples=1):
    tokenizer = CharTokenizer()
    path, _ = asyncio.run(run_samples(
        adapter=adapter, tasks=tasks, samples=samples, seed=0, services=Services(),
        backend_for=lambda task, sample: ScriptedBackend(scripts(task, sample), tokenizer),
        tokenizer=tokenizer, config=REPLAY_CONFIG, out=out,
        manifest={"model": "gold", "scale": "smoke", "config_hash": "0" * 16, "git_commit": "",
                  "package_versions": {}},
        progress=False))
    return read_results(path).lines, read_results(prerequisite_path(path)).lines


def test_gold_replay_passes_on_every_agentic_category():
    passed, total, failed, by_split = selfcheck_bfcl_agentic(limit=2)
    assert total == 10 and passed == total and not failed, failed[:2]
    assert by_split["memory_kv (prerequisite conversations)"] == (10, 10)  # customer: a chain of 10


def test_multi_turn_adapter_refuses_agentic_and_names_bfcl_v4():
    with pytest.raises(ValueError, match="agentic category: run it with benchmark bfcl_v4"):
        BfclMultiTurnAdapter().load_tasks(["memory_kv"], 1)


def test_memory_questions_see_the_memory_their_chain_wrote_one_chain_per_sample(tmp_path):
    """rec_sum: each prerequisite conversation appends a note naming its sample; the question's system
    prompt (bfcl-eval's: the memory content) and memory_retrieve show that sample's notes only."""
    adapter = _adapter(tmp_path)
    tasks = adapter.load_tasks(["memory_rec_sum"], 1)
    stages = prerequisite_stages(tasks)
    assert [len(s) for s in stages] == [1] * 5  # notetaker: 5 conversations, one per stage
    assert [t.task_id for s in stages for t in s] == [t.task_id for t in tasks if t.meta["prerequisite"]]

    def script(task, sample):
        if task.meta["prerequisite"]:
            write = ToolCall("memory_append", {"text": f"[s{sample}:{task.task_id[-1]}]"})
            return script_for_calls([[write]] + [[]] * (len(task.meta["entry"]["question"]) - 1), "noted")
        return script_for_calls([[ToolCall("memory_retrieve", {})]], gold_answer(task))

    lines, pre = _run(adapter, tasks, script, tmp_path / "out.jsonl", samples=2)
    assert len(pre) == 10 and all(x["status"] == "ok" and x["extra"]["prerequisite"] for x in pre)
    assert len(lines) == 2 and all(x["score"] == 1.0 for x in lines)
    for line in lines:
        k = line["sample"]
        system = line["trajectory"]["messages"][0]["content"]
        assert system.startswith("You are a personal organization assistant")  # bfcl-eval's setting
        assert "".join(f"[s{k}:{i}]" for i in range(5)) in system
        retrieved = line["trajectory"]["messages"][3]["content"]
        assert f"[s{k}:4]" in retrieved and f"[s{1 - k}:" not in retrieved
    # a question does not write back: the chain's last snapshot is unchanged by the questions
    store = adapter.agentic().store
    last = stages[-1][0].task_id
    assert json.loads(store.path(0, 0, "memory_rec_sum", last).read_text())["memory"].endswith("[s0:4]")


def test_a_resumed_chain_restarts_a_conversation_from_its_predecessor(tmp_path):
    """Kill after the third conversation's snapshot was stored but before its line was: the re-run runs
    it again from the second one's memory, not from its own (no note written twice)."""
    adapter = _adapter(tmp_path)
    tasks = adapter.load_tasks(["memory_rec_sum"], 1)
    pre = [t for t in tasks if t.meta["prerequisite"]]

    def script(task, sample):
        if task.meta["prerequisite"]:
            return script_for_calls([[ToolCall("memory_append", {"text": f"<{task.task_id[-1]}>"})]], "ok")
        return script_for_calls([[]], gold_answer(task))

    out = tmp_path / "out.jsonl"
    _run(adapter, tasks, script, out)
    store = adapter.agentic().store
    final = json.loads(store.path(0, 0, "memory_rec_sum", pre[-1].task_id).read_text())["memory"]
    assert final == "<0><1><2><3><4>"
    # a crash between conversation 2's snapshot and its result line: only conversations 0 and 1 are done
    lines = [json.loads(x) for x in prerequisite_path(out).read_text().splitlines()[:2]]
    partial = out.with_name(out.name + ".partial.jsonl")
    partial.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out.with_name(out.name + ".partial.meta.json").write_text(json.dumps({"config_hash": "0" * 16}))
    out.unlink()
    _run(adapter, tasks, script, out)
    final = json.loads(store.path(0, 0, "memory_rec_sum", pre[-1].task_id).read_text())["memory"]
    assert final == "<0><1><2><3><4>"


def test_memory_system_prompt_equals_bfcl_evals_own(tmp_path, monkeypatch):
    for name in ("tree_sitter", "tree_sitter_java", "tree_sitter_javascript"):  # imported, not used here
        monkeypatch.setitem(sys.modules, name, mock.MagicMock())
    for name in [m for m in sys.modules if m.startswith("bfcl_eval.model_handler")]:
        monkeypatch.delitem(sys.modules, name)
    from bfcl_eval.model_handler.utils import add_memory_instruction_system_prompt

    adapter = _adapter(tmp_path)
    for split in ("memory_kv", "memory_rec_sum"):
        task = adapter.load_tasks([split], 1)[-1]  # a question (it has bfcl-eval's answer-format message)
        episode = adapter.new_episode(task, 0, 0, Services())
        if split == "memory_kv":
            episode.step(ToolCall("core_memory_add", {"key": "user_name", "value": "Ada"}))
        theirs = add_memory_instruction_system_prompt(json.loads(json.dumps(task.meta["entry"]["question"])),
                                                      split, "notetaker", episode.instance)
        assert theirs[0][0]["role"] == "system"
        ours = memory_system_prompt(split, "notetaker", episode.instance, task.system)
        assert ours == theirs[0][0]["content"]


def test_memory_vector_uses_the_configured_encoder_not_a_download():
    cls = memory_backend_class("memory_vector", "hashing")
    module = sys.modules[cls.__module__]
    assert isinstance(module.ENCODER, HashingEncoder) and module.ENCODER_DIM == 64
    api = cls()
    a = api.archival_memory_add("the cat sat on the mat")
    api.archival_memory_add("quarterly revenue grew nine percent")
    hits = api.archival_memory_retrieve("where did the cat sit", top_k=1)["result"]
    assert hits[0]["id"] == a["id"]
    with pytest.raises(RuntimeError, match="already uses encoder 'hashing'"):
        memory_backend_class("memory_vector", "hashing:32")
    with pytest.raises(ValueError, match="memory.encoder"):
        load_encoder("hashing:x")
    emb = load_encoder("hashing:16").encode(["a b", "a b"], normalize_embeddings=True)
    assert emb.shape == (2, 16) and (emb[0] == emb[1]).all()


def test_web_search_replays_the_cache_and_counts_misses(tmp_path):
    adapter = _adapter(tmp_path)
    base = adapter.load_tasks(["web_search_base"], 1)[0]
    no_snippet = adapter.load_tasks(["web_search_no_snippet"], 1)[0]
    assert "For your final answer to the user" in base.system  # bfcl-eval's answer format
    ep = adapter.new_episode(base, 0, 0, Services())
    # bfcl-eval stringifies a list result with str() (a dict with json.dumps)
    tea = {"keywords": "most expensive tea in the world"}
    hits = ast.literal_eval(ep.step(ToolCall("search_engine_query", tea)))
    assert hits[0] == {"title": "Da Hong Pao - the most expensive tea",
                       "href": "https://example.org/tea/da-hong-pao",
                       "body": "Da Hong Pao, a rock oolong from the Wuyi Mountains of Fujian, China, is the "
                               "most expensive tea."}
    short = ast.literal_eval(ep.step(ToolCall("search_engine_query", {**tea, "max_results": 1})))
    assert len(short) == 1
    page = json.loads(ep.step(ToolCall("fetch_url_content", {"url": "https://example.org/forbes/china",
                                                             "mode": "truncate"})))
    assert page["content"] == "China's richest\nZhang Yiming leads the April 2025 Forbes list for China."
    assert "404" in ep.step(ToolCall("fetch_url_content", {"url": "https://example.org/tea/list"}))
    quota = ToolCall("search_engine_query", {"keywords": "quota exhausted example"})
    assert "Failed to retrieve" in ep.step(quota)
    missed = json.loads(ep.step(ToolCall("search_engine_query", {"keywords": "something else"})))
    assert missed["error"].startswith("replay: no recorded search response")
    assert "Invalid URL" in ep.step(ToolCall("fetch_url_content", {"url": "file:///etc/passwd"}))
    ep.user_reply("{'answer': 'Zhang Yiming', 'context': 'Forbes'}")
    score = ep.score()
    assert score.score == 1.0 and score.extra["cache_misses"] == 1 and score.extra["cache_hits"] == 5
    ep2 = adapter.new_episode(no_snippet, 0, 0, Services())
    hits = ast.literal_eval(ep2.step(ToolCall("search_engine_query", tea)))
    assert set(hits[0]) == {"title", "href"}  # bfcl-eval's show_snippet=False
    ep2.user_reply("{'answer': 'I do not know', 'context': 'I do not know'}")
    assert ep2.score().extra["error_type"] == "agentic:answer_not_found"


def test_replay_needs_an_existing_cache_and_live_needs_the_key(tmp_path, monkeypatch):
    adapter = _adapter(tmp_path, cache=str(tmp_path / "none.jsonl"))
    task = adapter.load_tasks(["web_search_base"], 1)[0]
    with pytest.raises(ValueError, match=r"web_search.cache: .*none.jsonl does not exist"):
        adapter.new_episode(task, 0, 0, Services())
    monkeypatch.delenv("ENVACE_TEST_SERP_KEY", raising=False)
    with pytest.raises(ValueError, match="ENVACE_TEST_SERP_KEY"):
        WebBackend("live", tmp_path / "c.jsonl", api_key_env="ENVACE_TEST_SERP_KEY")
    with pytest.raises(ValueError, match="web_search.mode must be one of"):
        WebBackend("offline", tmp_path / "c.jsonl")


def test_live_responses_are_recorded_without_the_key_and_replay_exactly(tmp_path, monkeypatch):
    import serpapi

    seen = []

    class FakeSearch:
        def __init__(self, params):
            seen.append(dict(params))

        def get_dict(self):
            return {"organic_results": [{"title": "T", "link": "https://example.org/x", "snippet": "S"}]}

    monkeypatch.setattr(serpapi, "GoogleSearch", FakeSearch)
    monkeypatch.setenv("ENVACE_TEST_SERP_KEY", "sk-secret-123")
    cache = tmp_path / "cache.jsonl"
    live = WebBackend("live", cache, api_key_env="ENVACE_TEST_SERP_KEY")
    api = web_search_api_class()()
    api._load_scenario({"show_snippet": True})
    api.backend = live
    first = api.search_engine_query("a question")
    assert seen[0]["api_key"] == "sk-secret-123" and seen[0]["engine"] == "duckduckgo"
    assert "sk-secret" not in cache.read_text() and "sk-secret" not in json.dumps(live.record())
    api.backend = WebBackend("replay", cache)
    assert api.search_engine_query("a question") == first and len(seen) == 1
    assert live.record()["bfcl_web_search_cache_sha256"] == ResponseCache(cache).sha256() != "absent"
    # a client error quoting the request URL (with the key) is stored and shown without the key
    class FailingSearch(FakeSearch):
        def get_dict(self):
            raise ConnectionError("GET https://serpapi.com/search?q=x&api_key=sk-secret-123 failed")

    monkeypatch.setattr(serpapi, "GoogleSearch", FailingSearch)
    api.backend = live
    failed = api.search_engine_query("another question")
    assert "sk-secret" not in json.dumps(failed) and "sk-secret" not in cache.read_text()
    assert "<redacted>" in cache.read_text()
    # a URL the live fetcher refuses is an observation, never a request, and is not recorded
    api.backend = live
    refused = api.fetch_url_content("http://127.0.0.1:8000/admin")
    assert refused["error"].startswith("refused:") and "127.0.0.1" not in cache.read_text()


@pytest.mark.parametrize("url", ["http://127.0.0.1/", "http://localhost:8080/x", "http://10.1.2.3/",
                                 "http://192.168.0.1/", "http://169.254.169.254/latest/meta-data/",
                                 "http://[::1]/", "http://0.0.0.0/", "http://100.64.0.1/",
                                 "http://[::ffff:127.0.0.1]/", "ftp://example.org/", "file:///etc/passwd",
                                 "http://user:pw@example.org/", "gopher://example.org/"])
def test_guarded_get_refuses_urls_that_are_not_public_http(url):
    with pytest.raises(UnsafeURLError):
        guarded_get(url, timeout_s=1, max_bytes=100)


def test_episode_dispatch_is_a_whitelist(tmp_path):
    adapter = _adapter(tmp_path)
    task = adapter.load_tasks(["memory_kv"], 1)[-1]
    ep = adapter.new_episode(task, 0, 0, Services())
    assert "not defined" in ep.step(ToolCall("_flush_memory_to_local_file", {}))
    assert "not defined" in ep.step(ToolCall("__class__", {}))
    assert ep.step(ToolCall("core_memory_add", {"nope": 1})).startswith("Error during execution:")


def test_wrong_answer_scores_zero_through_the_runner(tmp_path):
    adapter = _adapter(tmp_path)
    task = adapter.load_tasks(["web_search_base"], 1)[0]
    episode = adapter.new_episode(task, 0, 0, Services())
    backend = ScriptedBackend(["{'answer': 'Jack Ma', 'context': 'guess'}"])
    result = asyncio.run(run_episode(task, episode, backend, CharTokenizer(), REPLAY_CONFIG))
    assert result["status"] == "ok" and result["score"] == 0.0
    assert result["extra"]["error_type"] == "agentic:answer_not_found"


def test_limit_and_scenarios_select_questions_and_their_whole_chain():
    tasks = load_agentic_tasks("memory_kv", 2, ["finance", "notetaker"])
    questions = [t for t in tasks if not t.meta["prerequisite"]]
    assert [t.task_id for t in questions] == ["memory_kv_55-finance-0", "memory_kv_56-finance-1"]
    assert sum(t.meta["prerequisite"] for t in tasks) == 7  # finance's chain only
    assert all(t.meta["predecessor"] == tasks[6].task_id for t in questions)


def test_memory_vector_loads_a_sentence_transformers_folder_in_its_own_process(tmp_path):
    """The cluster path (``memory.encoder``: a local folder or hub id): a real ``SentenceTransformer``
    saved in-process from the tiny model (mean pooling), loaded by path in a fresh process (bfcl-eval's
    module keeps one encoder per process) before bfcl-eval's module could load its own."""
    import subprocess
    import textwrap

    from envace.serve.tiny_model import build_tiny_model

    lm = build_tiny_model(tmp_path / "lm", seed=0)
    st = tmp_path / "st"
    code = textwrap.dedent(f"""
        import sys
        from sentence_transformers import SentenceTransformer, models
        word = models.Transformer({str(lm)!r})
        pool = models.Pooling(word.get_word_embedding_dimension(), "mean")
        SentenceTransformer(modules=[word, pool], device="cpu").save({str(st)!r})
        from envace.bench.bfcl.memory import memory_backend_class
        cls = memory_backend_class("memory_vector", {str(st)!r})
        module = sys.modules[cls.__module__]
        api = cls()
        api.archival_memory_add("the cat sat on the mat")
        api.archival_memory_add("quarterly revenue grew nine percent")
        hit = api.archival_memory_retrieve("quarterly revenue grew nine percent", top_k=1)["result"][0]
        print(type(module.ENCODER).__name__, module.ENCODER_DIM, hit["id"], round(hit["similarity_score"], 4))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["SentenceTransformer", "64", "1", "1.0"]


def test_guarded_get_fetches_caps_the_size_and_checks_every_redirect_hop(monkeypatch):
    """A local HTTP server stands in for a public host (the address check is relaxed for 127.0.0.1 only,
    in this test): the page comes back cut at ``max_bytes``; a redirect to a private address is refused
    at that hop, before any connection to it."""
    import http.server
    import threading

    from envace.bench.bfcl import web as bfcl_web

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the stdlib's name)
            if self.path == "/jump":
                self.send_response(302)
                self.send_header("Location", "http://10.0.0.1/inside")
                self.end_headers()
                return
            body = ("<p>" + "x" * 5000 + "</p>").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    real = bfcl_web._public_address
    monkeypatch.setattr(bfcl_web, "_public_address",
                        lambda host, port: "127.0.0.1" if host == "127.0.0.1" else real(host, port))
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        page = guarded_get(url + "/page", timeout_s=5, max_bytes=100)
        assert page["status"] == 200 and page["text"] == "<p>" + "x" * 97
        with pytest.raises(UnsafeURLError, match="10.0.0.1"):
            guarded_get(url + "/jump", timeout_s=5, max_bytes=100)
    finally:
        server.shutdown()
