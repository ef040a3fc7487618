"""scripts/install.sh's pip filter (quiet_pip): pip's file:// "Location ... is ignored" lines
are dropped, every other line and pip's exit status are kept, under `set -euo pipefail`."""

from __future__ import annotations

import pathlib
import subprocess

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "install.sh"
NOISE = ("WARNING: Location 'file:///opt/pypi-more/simple/six/' is ignored: it is neither a "
         "file nor a directory.")


def _run(command: str) -> subprocess.CompletedProcess:
    """``command`` after install.sh's quiet_pip definition (and what it needs)."""
    text = SCRIPT.read_text()
    start = text.index("PIP_NOISE=")
    end = text.index("\n}\n", start) + 3
    program = "set -euo pipefail\n" + text[start:end] + command
    return subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "NOISE": NOISE})


def test_quiet_pip_drops_only_the_file_index_noise_and_keeps_the_status():
    """A fresh shell (no background job yet, as in a clean clone's first install): the
    noise line is gone, a real warning and stdout stay, and a failing command's status
    comes back as the function's."""
    fake = """bash -c 'echo installed; echo "$NOISE" >&2; echo "WARNING: real" >&2'"""
    out = _run(f"quiet_pip {fake}\necho status=$?\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["installed", "status=0"]
    assert out.stderr.strip() == "WARNING: real"
    failed = _run("quiet_pip bash -c 'echo boom >&2; exit 3' || echo failed=$?\n")
    assert failed.stdout.strip() == "failed=3" and failed.stderr.strip() == "boom"


def test_the_project_builds_without_setuptools_warnings_and_ships_the_java_sources(tmp_path):
    """A wheel of the project (what `pip install` builds) comes without setuptools'
    warnings (its first one was about the Java sources' folder not being listed), and
    holds read_topic_df's Java sources that jobs/jvm/build.py compiles on first use."""
    import sys
    import zipfile
    root = SCRIPT.parent.parent
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PIP_NO_INPUT": "1"}
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                          str(tmp_path), str(root)], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stderr.splitlines()
                if "Warning" in line and "is ignored: it is neither" not in line]
    assert warnings == [], out.stderr
    (wheel,) = tmp_path.glob("raykafka-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    java = sorted(n for n in names if n.endswith(".java"))
    expected = sorted(str(p.relative_to(root))
                      for p in (root / "jobs" / "jvm" / "src").rglob("*.java"))
    assert java == expected and java
