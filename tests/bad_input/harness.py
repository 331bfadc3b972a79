"""The CLI run in-process on a private workspace, and what every refused command must show.

A case runs ``ratebeam.pipelines.cli.main`` in this process with stdout and stderr captured (one
subprocess per case would cost a second of imports each; CI has two cores).  A refused command
must exit with the documented status, say in its last line where the mistake is (file, key,
value), never print a traceback or an internal error, and leave the database and the storage
byte-identical: ``snapshot`` hashes the SQLite file (and its WAL, where committed pages wait) and
every file of the storage tree.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from ratebeam.pipelines.cli import main

#: A case's setup: edits the workspace whose ratebeam.yaml it is given.
Setup = Callable[[Path], Any]


@dataclass(frozen=True)
class Outcome:
    """What a command did: its exit status and everything it printed."""

    status: int | str | None
    out: str
    err: str


def cli(*argv: object) -> Outcome:
    """``ratebeam ARGV`` in this process (argparse's own errors exit through ``SystemExit``)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status: int | str | None = main([str(a) for a in argv])
        except SystemExit as exc:
            status = exc.code
    return Outcome(status, out.getvalue(), err.getvalue())


def snapshot(root: Path) -> dict[str, str]:
    """The sha256 of the database (main file + WAL) and of every storage file under ``root``.

    SQLite's shared-memory index (``-shm``) changes when a reader only looks, so it is left out;
    a missing WAL and an empty one are the same state (the last connection to close removes it).
    """
    hashes: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if path.is_dir() or name.endswith("-shm"):
            continue
        if name.startswith("ratebeam.db") or name.startswith("rated/"):
            try:
                data = path.read_bytes()
            except FileNotFoundError:  # the WAL, removed as the last connection closed
                continue
            if name.endswith("-wal") and not data:
                continue
            hashes[name] = hashlib.sha256(data).hexdigest()
    return hashes


@dataclass(frozen=True)
class Case:
    """One bad input: how to make it, the command, the status and what the message must name."""

    id: str
    setup: Setup | None
    argv: tuple[str, ...]
    status: int = 2
    names: tuple[str, ...] = ()
    #: argparse's own refusals print the usage line first, then ``ratebeam ...: error: ...``.
    usage: bool = False
    #: Refused once the pipeline started (a server's answer): ``run`` said what it rates first.
    started: bool = False
    #: Start from the rated workspace (state and stored points a mistake must not touch).
    rated: bool = False
    marks: tuple[Any, ...] = field(default=())

    def param(self) -> Any:
        return pytest.param(self, id=self.id, marks=self.marks)


def params(cases: Sequence[Case]) -> list[Any]:
    ids = [c.id for c in cases]
    duplicates = {i for i in ids if ids.count(i) > 1}
    assert not duplicates, duplicates
    return [c.param() for c in cases]


def expand(argv: Sequence[str], ws: Path) -> list[str]:
    """The command line with ``{ws}`` (the workspace) and ``{c}`` (its ratebeam.yaml) filled in."""
    return [a.replace("{c}", str(ws)).replace("{ws}", str(ws.parent)) for a in argv]


def check_refused(case: Case, ws: Path) -> Outcome:
    """Run ``case`` on the workspace ``ws`` (its ratebeam.yaml) and assert it was refused cleanly."""
    if case.setup is not None:
        case.setup(ws)
    before = snapshot(ws.parent)
    done = cli(*expand(case.argv, ws))
    assert_refused(done, case, ws)
    assert snapshot(ws.parent) == before, "a refused command changed the database or the storage"
    return done


def assert_refused(done: Outcome, case: Case, ws: Path) -> None:
    """The status, one message naming the place, and nothing a user should not see."""
    everything = done.out + done.err
    assert "Traceback" not in everything, everything
    assert "internal error" not in everything, everything
    assert done.status == case.status, (done.status, done.err)
    lines = [line for line in done.err.splitlines() if line.strip()]
    assert lines, "refused without a word"
    if case.usage:
        message = lines[-1]
        assert "error:" in message, done.err
    elif case.started:
        assert len(lines) == 2 and lines[0].startswith("ratebeam run: rating due periods"), done.err
        message = lines[1]
    else:
        assert len(lines) == 1, done.err
        message = lines[0]
    assert message.startswith("ratebeam"), message
    assert len(message) < 1200, f"a {len(message)}-character message"
    for name in case.names:
        expected = name.replace("{c}", str(ws)).replace("{ws}", str(ws.parent))
        assert expected in message, (expected, message)


# ---- editing the workspace's files ----


def write(relative: str, text: str | bytes) -> Setup:
    """Setup: the workspace file ``relative`` now holds ``text``."""

    def edit(ws: Path) -> None:
        target = ws.parent / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            target.write_bytes(text)
        else:
            target.write_text(text, encoding="utf-8")

    return edit


def replace(relative: str, old: str, new: str, count: int = 1) -> Setup:
    """Setup: ``old`` replaced by ``new`` in the workspace file ``relative`` (which must contain it)."""

    def edit(ws: Path) -> None:
        target = ws.parent / relative
        text = target.read_text(encoding="utf-8")
        assert old in text, (old, relative)
        target.write_text(text.replace(old, new, count), encoding="utf-8")

    return edit


def _set_key(relative: str, path: Sequence[str | int], value: Any, load: Callable[[str], Any],
             dump: Callable[[Any], str]) -> Setup:
    def edit(ws: Path) -> None:
        target = ws.parent / relative
        document = load(target.read_text(encoding="utf-8"))
        _set(document, path, value)
        target.write_text(dump(document), encoding="utf-8")

    return edit


def set_yaml(relative: str, path: Sequence[str | int], value: Any) -> Setup:
    """Setup: the key ``path`` of the YAML file ``relative`` set to ``value`` (``DELETE`` removes it)."""
    return _set_key(relative, path, value, yaml.safe_load, lambda d: yaml.safe_dump(d, sort_keys=False))


def set_json(relative: str, path: Sequence[str | int], value: Any) -> Setup:
    """Setup: the key ``path`` of the JSON file ``relative`` set to ``value`` (``DELETE`` removes it)."""
    return _set_key(relative, path, value, json.loads, json.dumps)


DELETE = object()


def _set(document: Any, path: Sequence[str | int], value: Any) -> None:
    node = document
    for part in path[:-1]:
        node = node[part]
    if value is DELETE:
        del node[path[-1]]
    elif isinstance(node, list) and path[-1] == len(node):
        node.append(value)
    else:
        node[path[-1]] = value


def both(*setups: Setup) -> Setup:
    """Setup: several edits in order."""

    def edit(ws: Path) -> None:
        for setup in setups:
            setup(ws)

    return edit


def nested(depth: int, opening: str = "[", closing: str = "]") -> str:
    """A value nested ``depth`` levels deep (deeper than any recursive parser follows)."""
    return opening * depth + closing * depth


#: A YAML bomb: seven anchors expanding to 9**7 (4.8 million) strings.
BOMB = ('[&a [lol, lol, lol, lol, lol, lol, lol, lol, lol], &b [*a, *a, *a, *a, *a, *a, *a, *a, *a], '
        '&c [*b, *b, *b, *b, *b, *b, *b, *b, *b], &d [*c, *c, *c, *c, *c, *c, *c, *c, *c], '
        '&e [*d, *d, *d, *d, *d, *d, *d, *d, *d], &f [*e, *e, *e, *e, *e, *e, *e, *e, *e], '
        '&g [*f, *f, *f, *f, *f, *f, *f, *f, *f]]')
