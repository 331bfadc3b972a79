"""What the wheel is built from, and the runtime install of it that the wheel and image tests share.

The wheel is built from a copy of the sources it ships (``SOURCES``), never in the checkout: a
setuptools ``build/`` left in the tree would slip removed modules into the wheel.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The files and folders the wheel is built from (the Dockerfile's wheel stage copies the same).
SOURCES = ("pyproject.toml", "README.md", "ratebeam", "pipelines", "transforms", "connectors", "runner_configs")
#: Folders installed as ``ratebeam.<name>`` (pyproject's package-dir), ``ratebeam`` as itself.
PACKAGE_DIRS = {"ratebeam": "ratebeam", "pipelines": "ratebeam/pipelines", "transforms": "ratebeam/transforms",
                "connectors": "ratebeam/connectors", "runner_configs": "ratebeam/runner_configs"}
CONSTRAINTS = REPO / "constraints.txt"
#: The runtime extras of a rating service with the event stream on PostgreSQL.
SERVICE_EXTRAS = "service,events,postgresql"
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")


def copy_sources(dest: Path) -> Path:
    """The wheel's sources copied into ``dest`` (created); returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=_IGNORED)
        else:
            shutil.copy2(source, dest / name)
    return dest


def shipped_files(sources: Path) -> set[str]:
    """Every file of the package folders under ``sources``, as its path inside the wheel."""
    return {f"{installed}/{path.relative_to(sources / folder).as_posix()}"
            for folder, installed in PACKAGE_DIRS.items()
            for path in (sources / folder).rglob("*") if path.is_file()}


def build_wheel(sources: Path, outdir: Path) -> Path:
    """``python -m build --wheel`` of ``sources`` (isolated build environment); returns the wheel.

    What the build said is kept beside it, in ``build.log``.
    """
    done = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(outdir), str(sources)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (outdir / "build.log").write_text(done.stdout + done.stderr)
    (wheel,) = outdir.glob("ratebeam-*.whl")
    return wheel

