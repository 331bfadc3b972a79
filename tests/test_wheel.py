"""The built wheel alone, as a deployment installs it: no source checkout, no test tools.

``python -m build --wheel`` of a copy of the sources; the wheel must hold every module and data
file of the package folders (the demo data, the event definitions, the Alembic scripts and
versions, the runner configs).  It is installed with the runtime extras of a service only
(``SERVICE_EXTRAS``), at the versions of ``constraints.txt``, into one fresh virtualenv for the
module (pip's cache makes that ~1-2 min; the wheel build ~15 s), and the console script runs
from a folder outside the source tree: ``ratebeam demo``, ``ratebeam db upgrade`` on SQLite and
on the test PostgreSQL, ``ratebeam events serve --help``, and the shipped event definitions load.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import NamedTuple

import pytest
from package_support import CONSTRAINTS, REPO, SERVICE_EXTRAS, build_wheel, copy_sources, shipped_files
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from pipeline_support import workspace


class Installed(NamedTuple):
    """The virtualenv the wheel is installed in, and a folder outside the source tree."""

    venv: Path
    elsewhere: Path

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """The venv's ``ratebeam`` in ``elsewhere``, with nothing of the checkout on the path."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return subprocess.run([str(self.venv / "bin" / "ratebeam"), *args], cwd=self.elsewhere, env=env,
                              capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    return copy_sources(tmp_path_factory.mktemp("sources") / "ratebeam")


@pytest.fixture(scope="module")
def wheel(sources, tmp_path_factory) -> Path:
    return build_wheel(sources, tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Installed:
    venv = tmp_path_factory.mktemp("runtime") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # --no-compile: the modules a command imports are compiled when it first runs (a third of the time)
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-compile", "-c", str(CONSTRAINTS),
                           f"{wheel}[{SERVICE_EXTRAS}]"], capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return Installed(venv, tmp_path_factory.mktemp("elsewhere"))


def test_the_wheel_holds_every_module_and_data_file(sources, wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = shipped_files(sources)
    assert expected - names == set()
    for shipped in ("ratebeam/pipelines/demo_data/usage.csv", "ratebeam/pipelines/events/data/triggers.yaml",
                    "ratebeam/connectors/sql/alembic/script.py.mako", "ratebeam/connectors/sql/alembic/env.py",
                    "ratebeam/runner_configs/prism.yaml", "ratebeam/pipelines/commands/__init__.py"):
        assert shipped in names, shipped


def test_the_wheel_builds_without_setuptools_warnings_about_undeclared_packages(wheel):
    """setuptools warns when a folder of the package tree ships without being declared a package."""
    log = (wheel.parent / "build.log").read_text()
    assert "is absent from the `packages` configuration" not in log, log[-3000:]


def test_the_runtime_install_has_no_test_tools(installed):
    listed = subprocess.run([str(installed.venv / "bin" / "pip"), "list", "--format=freeze"],
                            capture_output=True, text=True, check=True, timeout=120).stdout.lower()
    packages = {line.split("==")[0].replace("_", "-") for line in listed.splitlines()}
    assert {"apache-beam", "ratebeam", "kombu", "prometheus-client", "psycopg"} <= packages
    assert packages.isdisjoint({"pytest", "mypy", "ruff", "duckdb", "hypothesis", "build", "matplotlib"}), packages


def test_demo_runs_from_the_installed_wheel_outside_the_source_tree(installed):
    done = installed.run("demo")
    assert done.returncode == 0, done.stderr[-3000:]
    where = subprocess.run([str(installed.venv / "bin" / "python"), "-c",
                            "import ratebeam.pipelines.demo as d; print(d.__file__)"],
                           cwd=installed.elsewhere, capture_output=True, text=True, check=True, timeout=120)
    assert where.stdout.startswith(str(installed.venv)) and str(REPO) not in where.stdout
    assert (installed.elsewhere / "ratebeam-demo" / "rated").is_dir()
    assert "acme-web" in done.stdout


def test_db_upgrade_runs_the_shipped_alembic_versions(installed, db_url, tmp_path):
    """On an empty SQLite file and an empty schema of the test PostgreSQL (conftest's ``db_url``)."""
    config = workspace(tmp_path / "ws", database_url=db_url)
    done = installed.run("db", "upgrade", "-c", str(config))
    assert done.returncode == 0, done.stderr[-3000:]
    versions = sorted(p.stem for p in (REPO / "connectors/sql/alembic/versions").glob("0*.py"))
    assert versions[-1].split("_", 1)[0] in done.stdout + done.stderr, done.stdout + done.stderr


def test_events_serve_help_and_the_shipped_event_definitions(installed, tmp_path):
    done = installed.run("events", "serve", "--help")
    assert done.returncode == 0 and "usage: ratebeam events serve" in done.stdout, done.stderr[-3000:]
    config = workspace(tmp_path / "ws", events={"source": {"transport_url": "rabbit://127.0.0.1:1/"}})
    code = ("import sys; from ratebeam.pipelines.config import load_config; events = load_config(sys.argv[1]).events; "
            "print(len(events.definition_set.definitions), sorted(events.pipelines))")
    loaded = subprocess.run([str(installed.venv / "bin" / "python"), "-c", code, str(config)],
                            cwd=installed.elsewhere, capture_output=True, text=True, timeout=120, check=False)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    count, pipelines = loaded.stdout.split(" ", 1)
    assert int(count) > 0 and pipelines.strip() != "[]"



def test_constraints_pin_every_requirement_within_pyproject_ranges():
    """``make lock`` was run after the last change of a range: each requirement of the package and of
    every extra has a pin in constraints.txt, and the pin is inside the range."""
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = Version(version)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(r) for r in project["dependencies"]]
    requirements += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        if name == "ratebeam":  # an extra made of other extras
            continue
        assert name in pins, f"{requirement}: not in constraints.txt (run make lock)"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{requirement}: pinned {pins[name]}"
