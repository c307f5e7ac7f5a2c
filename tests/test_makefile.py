"""The Makefile's install recipe: a machine without the disk it needs gets one clear line before anything
is created, and a failing pip stops the recipe (its output filter keeps pip's exit status)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60)


def test_an_install_without_the_disk_it_needs_stops_before_creating_the_venv(tmp_path):
    venv = tmp_path / "venv"
    proc = make(f"VENV={venv}", "INSTALL_FREE_GB=1000000", f"{venv}/.installed")
    assert proc.returncode != 0
    assert "the install needs ~1000000 GB free here" in proc.stderr
    assert "INSTALL_FREE_GB=N" in proc.stderr
    assert not venv.exists()


def test_a_failing_pip_stops_the_install(tmp_path):
    """PYTHON is a stand-in whose venv's pip exits 1: the recipe stops at the first pip line, not at the
    import check after every step."""
    fake = tmp_path / "python3"
    fake.write_text(
        '#!/bin/sh\n# "python3 -m venv DIR": a venv whose pip fails\n'
        'mkdir -p "$3/bin" && printf "#!/bin/sh\\necho pip failed >&2\\nexit 1\\n" > "$3/bin/pip" && '
        'chmod +x "$3/bin/pip"\n'
    )
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    proc = make(f"VENV={venv}", f"PYTHON={fake}", "INSTALL_FREE_GB=0", f"{venv}/.installed")
    assert proc.returncode != 0
    assert "pip failed" in proc.stdout + proc.stderr
    assert "import torch" not in proc.stdout  # stopped before the import check
    assert not (venv / ".installed").exists()
