"""The repository's documents stay true and stand alone.

* README.md fits on a few screens (at most 200 lines);
* every relative link of README.md, CONTRIBUTING.md, CHANGELOG.md and docs/ resolves: the file or
  folder exists and the ``#anchor`` is a heading of the target (GitHub's anchors);
* no "spec §" citation (CloudKitty is cited by its own file and line) and no absolute path of a
  build machine in README.md or docs/;
* LICENSE (Apache-2.0, as pyproject.toml says), CHANGELOG.md and CONTRIBUTING.md exist;
* docs/configuration.md is what ``tools/gen_config_doc.py`` makes from the models today;
* the ``console`` blocks of README.md's quickstart and of docs/getting-started.md run, in order, on
  a fresh workspace: each ``$ `` line is a command that must exit 0, the lines under it are lines its
  standard output must contain in that order (``…`` stands for lines left out); a ``yaml`` block whose
  first line is ``# file: NAME`` is written into the workspace (or, for ``examples/…``, is the
  repository's file of that name, which the configuration models must load).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ratebeam.pipelines.config import load_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *DOCS.rglob("*.md")])
#: README.md and everything under docs/ (the example configurations included).
STANDALONE = sorted([ROOT / "README.md", *(p for p in DOCS.rglob("*") if p.is_file())])
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
BIN = Path(sys.executable).parent


def _prose(text: str) -> str:
    """The page without its fenced blocks (a link inside code is an example, not a link)."""
    return FENCE.sub("", text)


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a Markdown page's headings (repeated headings get -1, -2 …)."""
    found: set[str] = set()
    for line in _prose(page.read_text()).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in found:
            n += 1
            anchor = f"{slug}-{n}"
        found.add(anchor)
    return found


def test_the_readme_fits_on_a_few_screens():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 200, f"README.md has {lines} lines"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: …: not this repository
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists() or ROOT not in (resolved, *resolved.parents):
            broken.append(f"{target}: no such file in the repository")
        elif anchor and (resolved.suffix != ".md" or anchor not in _anchors(resolved)):
            broken.append(f"{target}: no heading #{anchor} there")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_docs_cite_cloudkitty_by_file_and_name_no_machine_path():
    found = []
    for page in STANDALONE:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for bad in ("spec §", "/work/", "/root/", "/home/", "cloudkitty-spec"):
                if bad in line:
                    found.append(f"{page.relative_to(ROOT)}:{n}: {bad!r}")
    assert not found, found


def test_license_changelog_and_contributing_exist():
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()
    assert (ROOT / "CHANGELOG.md").read_text().startswith("# Changelog")
    assert "pytest -q tests/" in (ROOT / "CONTRIBUTING.md").read_text()  # how to run one test file


def test_the_configuration_reference_is_generated_from_the_models():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_config_doc.py"), "--check"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr


def _blocks(page: Path) -> list[tuple[str, str]]:
    """(language, text) of each fenced block of the page, in order."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", page.read_text(),
                                                           re.MULTILINE | re.DOTALL)]


def _commands(block: str) -> list[tuple[str, list[str]]]:
    """Each ``$ `` command of a console block with the output lines shown under it."""
    commands: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        elif commands:
            commands[-1][1].append(line)
    return commands


def _run(command: str, shown: list[str], workspace: Path) -> None:
    """Run one documented command; its stdout must hold the shown lines in order."""
    if command.split()[:2] == ["make", "demo"]:  # what `make demo` runs once .venv/ exists
        assert "\t$(VENV)/bin/ratebeam demo\n" in (ROOT / "Makefile").read_text()
        command = "ratebeam demo"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", "-c", command], cwd=workspace, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0, f"$ {command}\nexit {done.returncode}\n{done.stderr[-3000:]}"
    printed = [line.rstrip() for line in done.stdout.splitlines()]
    at = 0
    for line in (s.rstrip() for s in shown if s.strip() not in ("", "…")):
        try:
            at = printed.index(line, at) + 1
        except ValueError:
            pytest.fail(f"$ {command}\nexpected the line {line!r} (in this order); printed:\n{done.stdout}")


def _walk(page: Path, workspace: Path) -> int:
    """Write the page's files and run its console blocks in order; the number of commands run."""
    ran = 0
    for language, text in _blocks(page):
        first = text.splitlines()[0] if text.strip() else ""
        if language == "yaml" and first.startswith("# file: "):
            name = first.removeprefix("# file: ").strip()
            if name.startswith("examples/"):
                shipped = (page.parent / name).read_text()
                assert _without_comments(shipped) == _without_comments(text), f"{name} differs from the page"
                load_config(page.parent / name)  # the configuration models load it, metrics.yml included
            else:
                (workspace / name).write_text(text)
                yaml.safe_load(text)
        elif language == "console":
            for command, shown in _commands(text):
                _run(command, shown, workspace)
                ran += 1
    return ran


def _without_comments(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_readme_quickstart_runs_on_a_fresh_workspace(tmp_path):
    assert _walk(ROOT / "README.md", tmp_path) >= 4  # the demo, then the three commands a user types next


def test_getting_started_runs_on_a_fresh_workspace(tmp_path):
    assert _walk(DOCS / "getting-started.md", tmp_path) >= 7
