"""Context length of TTS runs (envace.report.tts_context) and its annotation of Figure 6."""

from __future__ import annotations

import csv
import dataclasses
import json
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from envace.common import atomic as atomic_mod
from envace.common.config import tts_hash
from envace.common.results import ResultsError, manifest_path, read_results, tts_path, write_results
from envace.report import figures, points, tts_context
from envace.report.context import ReportContext, write_output
from envace.report.tts_context import ContextStats, csv_path, csv_text, overall, summarize

from .conftest import EXAMPLE_CONFIG, EXAMPLE_RESULTS, run_cli


def _line(final: object = None, memory: object = None, **record: object) -> dict:
    """A result line; ``final``/``memory`` become the TTS record's fields when given."""
    if final is not None:
        record["commit_final_context_tokens"] = final
    if memory is not None:
        record["memory_tokens"] = memory
    return {"task_id": "t", "status": "ok", "extra": {"tts": record} if record else {}}


def test_summarize_hand_computed() -> None:
    a = [
        _line(1000, 100),
        _line(1400, 300, synthetic=True),
        _line(0, 50),  # the commit never generated: no context, but a memory
        {"task_id": "t", "status": "failed"},  # failed before its commit: no extra at all
        _line(),  # extra without a tts record
    ]
    b = [_line(1600, 0), _line(memory=20)]  # the second lacks the final context (older record): skipped
    s = summarize("sequential_n3_envace", "tau2", [("a.jsonl", a), ("b.jsonl", b)])
    assert s.ok and (s.lines, s.records, s.commits, s.synthetic) == (7, 4, 3, 1)
    assert s.final_context_mean == pytest.approx((1000 + 1400 + 1600) / 3)
    assert s.final_context_max == 1600
    assert s.memory_mean == pytest.approx((100 + 300 + 50 + 0) / 4)
    assert s.memory_max == 300


def test_summarize_without_records_is_missing() -> None:
    old = [{"task_id": "t", "status": "ok"}, _line()]
    s = summarize("parallel_n1_base", "tau2", [("old.jsonl", old)])
    assert not s.ok and s.lines == 2 and s.records == 0
    assert "none of its 2 lines has extra.tts.commit_final_context_tokens" in (s.missing or "")
    assert s.final_context_mean is None and s.memory_mean is None
    assert summarize("x", "tau2", []).missing == "no result line"
    never = summarize("x", "tau2", [("f", [_line(0, 10), _line(0, 30)])])
    assert not never.ok and "no commit generated" in (never.missing or "")
    assert never.final_context_mean is None and never.memory_mean == pytest.approx(20)


@pytest.mark.parametrize("bad", ["1200", -1, True, 3.5, None])
def test_corrupt_field_is_an_error(bad: object) -> None:
    lines = [_line(1000, 10), {"task_id": "t", "status": "ok",
                               "extra": {"tts": {"commit_final_context_tokens": bad, "memory_tokens": 5}}}]
    with pytest.raises(ResultsError, match=r"b\.jsonl: line 2: extra\.tts\.commit_final_context_tokens"):
        summarize("x", "tau2", [("b.jsonl", lines)])


def _stats(bench: str, final: float | None, final_max: int | None, memory: float, memory_max: int,
           records: int, missing: str | None = None) -> ContextStats:
    return ContextStats("s", bench, records, records, records, final, final_max, memory, memory_max, missing)


def test_overall_is_the_mean_of_benchmark_means() -> None:
    tau2 = _stats("tau2", 1000.0, 1300, 100.0, 150, records=3)
    bfcl = _stats("bfcl_multi_turn", 2000.0, 2000, 40.0, 40, records=1)
    o = overall("s", [tau2, bfcl])
    # each benchmark weighs the same (as Figure 6's Overall), not each record: (1000 + 2000) / 2, not 1250
    assert o.ok and o.benchmark == "overall" and o.final_context_mean == pytest.approx(1500.0)
    assert (o.final_context_max, o.memory_max, o.records) == (2000, 150, 4)
    assert o.memory_mean == pytest.approx(70.0)
    gone = overall("s", [tau2, _stats("bfcl_multi_turn", None, None, 0.0, 0, 0, missing="no manifest")])
    assert not gone.ok and gone.final_context_mean is None
    assert "bfcl_multi_turn: no manifest" in (gone.missing or "")
    with pytest.raises(ValueError):
        overall("s", [])


def test_csv_text_and_path() -> None:
    rows = [
        _stats("tau2", 1234.56, 1500, 80.0, 90, records=2),
        _stats("overall", None, None, 0.0, 0, 0, missing="tau2: no manifest"),
    ]
    rows[0] = dataclasses.replace(rows[0], setting="parallel_n3_envace")
    rows[1] = dataclasses.replace(rows[1], setting="no_tts")
    text = csv_text(rows, "HEADER")
    assert text.startswith("# HEADER\n")
    parsed = list(csv.DictReader(text.splitlines()[1:]))
    assert parsed[0]["mode"] == "parallel" and parsed[0]["n"] == "3" and parsed[0]["rehearser"] == "envace"
    assert parsed[0]["final_context_tokens_mean"] == "1234.6"
    assert parsed[0]["final_context_tokens_max"] == "1500"
    assert parsed[1]["final_context_tokens_mean"] == "" and parsed[1]["missing"] == "tau2: no manifest"
    assert (parsed[1]["mode"], parsed[1]["n"], parsed[1]["rehearser"]) == ("no_tts", "", "")
    assert csv_path("figures/fig6_tts_vs_n.pdf") == Path("figures/fig6_tts_vs_n_context.csv")


def _write_tts(cfg: dict, root: Path, setting: str, bench: str, lines: list[dict], **kw: object) -> Path:
    path = tts_path(root, setting, bench, cfg["tts"]["seeds"][0])
    full = [
        {"benchmark": bench, "split": "airline", "task_id": f"t{i}", "sample": 0, "seed": 0, "score": 1.0,
         "subscores": {}, "status": "ok", "reason": None, **line}
        for i, line in enumerate(lines)
    ]
    return write_results(path, full, model=setting, benchmark=bench, seed=0, scale=cfg["scale"],
                         config_hash=kw.get("config_hash", tts_hash(cfg, setting, bench)),
                         git_commit="test", package_versions={})


def test_load_from_files(cfg: dict, tmp_path: Path) -> None:
    setting = "sequential_n3_envace"
    _write_tts(cfg, tmp_path, setting, "tau2",
               [{"extra": {"tts": {"commit_final_context_tokens": c, "memory_tokens": m}}}
                for c, m in [(900, 30), (1100, 50)]])
    s = tts_context.load(cfg, tmp_path, setting, "tau2")
    assert s.ok and s.final_context_mean == pytest.approx(1000.0) and s.memory_max == 50
    absent = tts_context.load(cfg, tmp_path, setting, "bfcl_multi_turn")
    assert not absent.ok and "does not exist" in (absent.missing or "")
    manifest_path(tts_path(tmp_path, setting, "tau2", 0)).unlink()
    assert "no manifest" in (tts_context.load(cfg, tmp_path, setting, "tau2").missing or "")
    _write_tts(cfg, tmp_path, setting, "tau2", [{}], config_hash="ffffffffffffffff")
    with pytest.raises(ResultsError, match="config hash mismatch"):
        tts_context.load(cfg, tmp_path, setting, "tau2")


def _hand_final_context(results: Path, setting: str, benches: list[str]) -> float:
    """Mean over benchmarks of each benchmark's mean commit final context, straight from the JSONL."""
    means = []
    for bench in benches:
        lines = [json.loads(x) for x in tts_path(results, setting, bench, 0).read_text().splitlines()]
        values = [x["extra"]["tts"]["commit_final_context_tokens"] for x in lines]
        means.append(sum(v for v in values if v > 0) / sum(v > 0 for v in values))
    return sum(means) / len(means)


def _draw_fig6(ctx: ReportContext) -> plt.Figure:
    fig = plt.figure()
    figures.fig6(ctx, fig)
    return fig


def test_fig6_has_the_context_axis(cfg: dict) -> None:
    ctx = ReportContext(cfg, EXAMPLE_RESULTS, resamples=50)
    fig = _draw_fig6(ctx)
    try:
        twins = [ax for ax in fig.axes if ax.yaxis.get_label_position() == "right"]
        assert len(twins) == len(cfg["tts"]["modes"])
        assert "mean final context" in twins[-1].get_ylabel() and "SYNTHETIC" in twins[-1].get_ylabel()
        assert twins[0].get_ylim() == twins[1].get_ylim() and twins[0].get_ylim()[0] == 0
        benches = list(cfg["tts"]["benchmarks"])
        for twin, mode in zip(twins, cfg["tts"]["modes"], strict=True):
            lines = {line.get_label(): line for line in twin.get_lines()}
            for reh in cfg["tts"]["rehearsers"]:
                line = lines[f"{reh}: mean final context"]
                assert list(line.get_xdata()) == list(cfg["tts"]["n"])
                hand = [_hand_final_context(EXAMPLE_RESULTS, f"{mode}_n{n}_{reh}", benches)
                        for n in cfg["tts"]["n"]]
                assert list(line.get_ydata()) == pytest.approx(hand)
            legend = twin.get_legend()
            assert legend is not None
            assert "envace: mean final context" in [t.get_text() for t in legend.get_texts()]
    finally:
        plt.close(fig)


def _strip_tts_records(cfg: dict, results: Path) -> None:
    """Rewrite every TTS file without ``extra`` (results written before context was recorded)."""
    for setting in cfg["tts"]["settings"]:
        for bench in cfg["tts"]["benchmarks"]:
            path = tts_path(results, setting, bench, 0)
            old = read_results(path)
            lines = [{k: v for k, v in line.items() if k != "extra"} for line in old.lines]
            m = old.manifest
            write_results(path, lines, model=m["model"], benchmark=bench, seed=0, scale=m["scale"],
                          config_hash=m["config_hash"], git_commit="old", package_versions={})


def test_figure6_command_writes_the_context_csv(cfg: dict, tmp_path: Path) -> None:
    out = tmp_path / "figs" / "fig6_tts_vs_n.pdf"
    argv = ["figures", "fig6", "--config", str(EXAMPLE_CONFIG), "--resamples", "50", "--out", str(out)]
    assert run_cli(argv) == 0
    table = out.with_name("fig6_tts_vs_n_context.csv")
    text = table.read_text()
    assert text.startswith("# ") and "values in tokens" in text.splitlines()[0]
    rows = list(csv.DictReader(text.splitlines()[1:]))
    settings = [s for s in cfg["tts"]["settings"] if s != "no_tts"]
    assert len(rows) == len(settings) * (len(cfg["tts"]["benchmarks"]) + 1)
    row = next(r for r in rows if r["setting"] == "sequential_n3_base" and r["benchmark"] == "overall")
    hand = _hand_final_context(EXAMPLE_RESULTS, "sequential_n3_base", list(cfg["tts"]["benchmarks"]))
    assert float(row["final_context_tokens_mean"]) == pytest.approx(hand, abs=0.05)
    assert int(row["synthetic"]) == int(row["records"]) > 0 and row["missing"] == ""
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(
        ["fig6_tts_vs_n.pdf", "fig6_tts_vs_n.png", "fig6_tts_vs_n_context.csv"]
    )  # no temporary file left behind


def test_old_results_without_records_still_render(cfg: dict, tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(EXAMPLE_RESULTS, results)
    _strip_tts_records(cfg, results)
    ctx = ReportContext(cfg, results, resamples=50)
    assert all(not s.ok for per in points.figure6_context(ctx).values() for s in per.values())
    fig = _draw_fig6(ctx)
    try:
        texts = [t.get_text() for ax in fig.axes for t in ax.texts]
        assert texts.count("context length: no TTS records") == len(cfg["tts"]["modes"])
    finally:
        plt.close(fig)
    out = tmp_path / "fig6.pdf"
    argv = ["figures", "fig6", "--config", str(EXAMPLE_CONFIG), "--results-dir", str(results),
            "--resamples", "50", "--out", str(out)]
    assert run_cli(argv) == 0
    rows = list(csv.DictReader(csv_path(out).read_text().splitlines()[1:]))
    assert rows and all(r["final_context_tokens_mean"] == "" and r["missing"] for r in rows)


def test_write_output_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_output(tmp_path / "a.csv", "old\n")

    def fail(src: str, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(atomic_mod.os, "replace", fail)  # write_output writes through envace.common.atomic
    with pytest.raises(OSError, match="disk full"):
        write_output(path, "new\n")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["a.csv"]
