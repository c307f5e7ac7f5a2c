"""``envace report-html``: the reproduction report page, read by a real headless browser.

The page is built from the example results' Tables 1-3, Figures 3-6 and paper diff (made here with the
same commands the DAG runs). The browser test opens it in Debian's Chromium (``/usr/bin/chromium``; CI
installs it and sets ``ENVACE_REQUIRE_BROWSER=1``, elsewhere the test skips without it) and reads what
the page's own script counted on ``load``: figures that decoded and tables. A corrupted PNG is the
negative control: one figure fewer decodes (a truncated PNG still decodes, its header gives a size;
bytes that are no image do not).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import EXAMPLE_CONFIG, run_cli

BASE = ["--config", str(EXAMPLE_CONFIG), "--resamples", "200"]
FIGURES = ["fig3", "fig4", "fig5", "fig6"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("report_inputs")
    for table in ("table1", "table2", "table3"):
        assert run_cli(["tables", table, *BASE, "--out-dir", str(out)]) == 0
    for fig in FIGURES:
        assert run_cli(["figures", fig, *BASE, "--out", str(out / f"{fig}.pdf")]) == 0
    assert run_cli(["diff", *BASE, "--out-md", str(out / "d.md"), "--out-json", str(out / "d.json")]) == 0
    (out / "train" / "envace_8b").mkdir(parents=True)
    (out / "train" / "envace_8b" / "done.json").write_text(json.dumps(
        {"run": "envace_8b", "last_step": 4, "trainer": "verl.trainer.main_ppo"}))
    return {"dir": out}


def build(inputs: dict[str, Path], out: Path, figures_dir: Path | None = None) -> str:
    d, figs = inputs["dir"], figures_dir or inputs["dir"]
    argv = ["report-html", "--tables", *[str(d / f"table{i}.md") for i in (1, 2, 3)],
            "--figures", *[str(figs / f"{f}.pdf") for f in FIGURES],
            "--diff-json", str(d / "d.json"), "--train-dir", str(d / "train"),
            "--out", str(out)]
    assert run_cli(argv) == 0
    return out.read_text()


def test_page_holds_tables_figures_diff_and_provenance(inputs: dict[str, Path], tmp_path: Path) -> None:
    page = build(inputs, tmp_path / "report.html")
    header = json.loads((inputs["dir"] / "d.json").read_text())["header"]
    assert page.count('src="data:image/png;base64,') == len(FIGURES)  # self-contained: no file links
    # claims, Tables 1-3, the paper cells and provenance
    assert page.count("<table") >= 6
    assert header["config_hash"] in page
    # top-down: the verdict first, provenance last; MISSING cells one line per reason
    order = [page.index(f"<h2>{h}</h2>") for h in ("Verdict", "Figures", "Tables", "Every paper cell",
                                                   "What ran where")]
    assert order == sorted(order) and page.index("<h3>Provenance</h3>") > order[-1]
    diff = json.loads((inputs["dir"] / "d.json").read_text())
    for claim in diff["claims"]:
        assert html.escape(claim["text"]) in page
    missing = {e["note"] or "no result" for e in diff["entries"] if e["status"] == "MISSING"}
    assert page.count("<li>MISSING, ") == len(missing) > 0
    assert "envace_8b 4 steps" in page and "verl.trainer.main_ppo" in page  # from the done-file
    assert oct((tmp_path / "report.html").stat().st_mode & 0o777) != oct(0o600)  # readable by others


def test_a_missing_figure_png_is_named(inputs: dict[str, Path], tmp_path: Path) -> None:
    figs = tmp_path / "figs"
    shutil.copytree(inputs["dir"], figs)
    (figs / "fig5.png").unlink()
    with pytest.raises(FileNotFoundError, match="fig5.png is missing"):
        build(inputs, tmp_path / "r.html", figures_dir=figs)
    assert not (tmp_path / "r.html").exists()


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("ENVACE_REQUIRE_BROWSER") == "1":
            pytest.fail("ENVACE_REQUIRE_BROWSER=1 but no chromium on PATH (apt-get install chromium)")
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium)")
    return path


def browser_counts(page: Path) -> dict[str, int]:
    """What the page's load script wrote into ``<body data-...>``, read from Chromium's DOM dump."""
    proc = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                           "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)
    body = re.search(r"<body([^>]*)>", proc.stdout)
    assert proc.returncode == 0 and body, proc.stderr[-2000:]
    return {k: int(v) for k, v in re.findall(r'data-([a-z-]+)="(\d+)"', body.group(1))}


def test_report_opens_in_headless_chromium(inputs: dict[str, Path], tmp_path: Path) -> None:
    build(inputs, tmp_path / "report.html")
    counts = browser_counts(tmp_path / "report.html")
    assert counts["figures"] == len(FIGURES) and counts["figures-loaded"] == len(FIGURES), counts
    assert counts["tables"] >= 5, counts

    figs = tmp_path / "figs"
    shutil.copytree(inputs["dir"], figs)
    png = figs / "fig4.png"
    png.write_bytes(b"\x89PNG but not an image")  # negative control: a damaged PNG does not decode
    build(inputs, tmp_path / "broken.html", figures_dir=figs)
    broken = browser_counts(tmp_path / "broken.html")
    assert broken["figures"] == len(FIGURES) and broken["figures-loaded"] == len(FIGURES) - 1, broken
