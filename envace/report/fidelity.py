"""The rehearsal-fidelity table (markdown + CSV) and figure from the JSON files of ``envace fidelity``
(scores from :mod:`envace.core.fidelity`)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from envace.common.atomic import atomic_write, atomic_write_text
from envace.core.fidelity import METRICS, paired_difference

__all__ = ["fidelity_table", "fidelity_figure"]


def _load(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    docs = []
    for path in paths:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(doc, dict) or "summary" not in doc or "model" not in doc or "benchmark" not in doc:
            raise ValueError(f"{path}: not an `envace fidelity` output (needs model, benchmark, summary)")
        docs.append(doc)
    return docs


def _cell(entry: Mapping[str, Any]) -> str:
    return f"{100 * entry['point']:.1f} [{100 * entry['ci_low']:.1f}, {100 * entry['ci_high']:.1f}]"


def _diff_cell(entry: Mapping[str, Any]) -> str:
    return f"{100 * entry['point']:+.1f} [{100 * entry['ci_low']:+.1f}, {100 * entry['ci_high']:+.1f}]"


def _paired_rows(docs: Sequence[Mapping[str, Any]], per_tool: bool, contrasts: Sequence[tuple[str, str]] = ()
                 ) -> list[tuple[str, str, str, Mapping[str, Any]]]:
    """``(benchmark, "A - B", tool, difference)``: the paired difference over the same pairs
    (:func:`envace.core.fidelity.paired_difference`) for every document A that rehearsed the calls of
    model B's trajectories where B's own document did too (``report.fidelity.trajectories``), then for
    each ``(A, B)`` of ``contrasts`` (``report.fidelity.contrasts``) whose documents rehearsed the same
    trajectories on one benchmark."""
    couples = []
    for ref in docs:
        if ref["trajectory_models"] != [ref["model"]] or not ref.get("pairs"):
            continue
        couples += [(doc, ref) for doc in docs if doc is not ref and doc["benchmark"] == ref["benchmark"]
                    and doc["trajectory_models"] == [ref["model"]]]
    for a, b in contrasts:
        couples += [(doc, ref) for doc in docs for ref in docs
                    if doc["model"] == a and ref["model"] == b and doc["benchmark"] == ref["benchmark"]
                    and doc["trajectory_models"] == ref["trajectory_models"] and ref.get("pairs")]
    rows = []
    for doc, ref in couples:
        diff = paired_difference(doc.get("pairs") or [], ref["pairs"], **(doc.get("bootstrap") or {}))
        if diff is None:
            continue
        entries = [("(all)", diff["overall"])] + (sorted(diff["per_tool"].items()) if per_tool else [])
        rows += [(doc["benchmark"], f"{doc['model']} - {ref['model']}", tool, d) for tool, d in entries]
    return rows


def fidelity_table(paths: Sequence[str | Path], out_md: str | Path, out_csv: str | Path,
                   per_tool: bool = True, contrasts: Sequence[tuple[str, str]] = ()) -> list[Path]:
    """Write the fidelity table (percent, 95% interval) from ``envace fidelity`` outputs; ``contrasts``:
    more ``A - B`` rows (:func:`_paired_rows`).

    Rows: (benchmark, model, tool) with ``tool = "(all)"`` for the overall row; columns: pairs, tasks and
    the three metrics. Written through a temporary file and renamed.
    """
    rows = []
    docs = sorted(_load(paths), key=lambda d: (d["benchmark"], d["model"]))
    for doc in docs:
        if doc["summary"]["overall"] is None:  # no (call, observation) pairs in its trajectories
            rows.append((doc["benchmark"], doc["model"], "(all)", None))
            continue
        entries = [("(all)", doc["summary"]["overall"])]
        if per_tool:
            entries += sorted(doc["summary"]["per_tool"].items())
        rows += [(doc["benchmark"], doc["model"], tool, s) for tool, s in entries]
    header = ["benchmark", "model", "tool", "pairs", "tasks", "success/error agreement", "exact JSON match",
              "field F1"]
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["benchmark", "model", "tool", "pairs", "tasks"]
                    + [f"{m}_{k}" for m in METRICS for k in ("point", "ci_low", "ci_high", "micro")])
    for bench, model, tool, s in rows:
        if s is None:
            md.append(f"| {bench} | {model} | {tool} | 0 | 0 | " + " | ".join(["— (no pairs)"] * len(METRICS))
                      + " |")
            writer.writerow([bench, model, tool, 0, 0] + [""] * (4 * len(METRICS)))
            continue
        md.append(f"| {bench} | {model} | {tool} | {s['n_pairs']} | {s['n_tasks']} | "
                  + " | ".join(_cell(s[m]) for m in METRICS) + " |")
        writer.writerow([bench, model, tool, s["n_pairs"], s["n_tasks"]]
                        + [s[m][k] for m in METRICS for k in ("point", "ci_low", "ci_high", "micro")])
    paired = _paired_rows(docs, per_tool, contrasts)
    for bench, label, tool, d in paired:
        md.append(f"| {bench} | {label} | {tool} | {d['n_pairs']} | {d['n_tasks']} | "
                  + " | ".join(_diff_cell(d[m]) for m in METRICS) + " |")
        writer.writerow([bench, label, tool, d["n_pairs"], d["n_tasks"]]
                        + [x for m in METRICS for x in (d[m]["point"], d[m]["ci_low"], d[m]["ci_high"], "")])
    note = ("\nRehearsal fidelity (%, task-level mean with 95% bootstrap interval over tasks): the model's "
            "REHEARSE prediction vs the real observation of every recorded (call, observation) pair.\n")
    if paired:
        note += ("Rows `A - B`: A's fidelity minus B's on the same pairs (both models rehearsing the same "
                 "trajectories), percentage points with a paired 95% bootstrap interval over tasks.\n")
    if any(d.get("scale") == "smoke" for d in docs):
        md.insert(0, "_SMOKE scale: a tiny model on a few tasks, not a reproduction_\n")
    return [atomic_write_text(out_md, "\n".join(md) + "\n" + note, parents=True),
            atomic_write_text(out_csv, buf.getvalue(), parents=True)]


def fidelity_figure(paths: Sequence[str | Path], out: str | Path) -> list[Path]:
    """One panel per metric; bars per (benchmark, model) with 95% intervals (none where a model has no
    pairs). Writes ``out`` (``.pdf``) and the same figure as ``.png`` beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs = sorted(_load(paths), key=lambda d: (d["benchmark"], d["model"]))
    benches = sorted({d["benchmark"] for d in docs})
    models = sorted({d["model"] for d in docs})
    fig, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 3.2), sharey=True)
    width = 0.8 / max(1, len(models))
    titles = {"agree": "success/error agreement", "exact": "exact JSON match", "field_f1": "field F1"}
    for ax, metric in zip(axes, METRICS, strict=True):
        for k, model in enumerate(models):
            xs, ys, lo, hi = [], [], [], []
            for b, bench in enumerate(benches):
                for d in docs:
                    if d["benchmark"] == bench and d["model"] == model and d["summary"]["overall"]:
                        e = d["summary"]["overall"][metric]
                        xs.append(b + (k - (len(models) - 1) / 2) * width)
                        ys.append(100 * e["point"])
                        lo.append(100 * (e["point"] - e["ci_low"]))
                        hi.append(100 * (e["ci_high"] - e["point"]))
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=model)
        ax.set_xticks(range(len(benches)), benches)
        ax.set_title(titles[metric])
        ax.set_ylim(0, 100)
    axes[0].set_ylabel("% (95% CI)")
    axes[-1].legend(fontsize="small")
    fig.tight_layout()
    pdf = Path(out)
    pdf.parent.mkdir(parents=True, exist_ok=True)
    outs = [pdf, pdf.with_suffix(".png")]
    for path in outs:  # the temporary file's name does not end in .pdf/.png: the format is given
        atomic_write(path, partial(fig.savefig, format=path.suffix[1:]))
    plt.close(fig)
    return outs
