"""One command-line grammar, checked on the parser itself (``build_parser()``), command by command.

* every global option parses before and after the sub-command;
* every command that prints data takes ``-f/--format`` with (at least) ``table``, ``json`` and
  ``csv``, and ``--json``;
* every time range is ``--from``/``--to``, with the aliases ``--begin``/``--end`` (and ``--since``
  for a lower bound) of the same options;
* ``docs/cli.md``'s command reference is the one the parser generates.

A command added without following it fails here: declare it in ``PRINTS_NOTHING`` only if it
prints no data (it acts, serves, or writes a file).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from ratebeam.pipelines.cli import build_parser, main
from ratebeam.pipelines.commands import reference
from ratebeam.pipelines.commands.grammar import FROM_OPTIONS, TO_OPTIONS, global_actions, key_value
from ratebeam.pipelines.commands.output import FORMATS
from ratebeam.pipelines.errors import InputError

#: Commands that print no data (they act, serve or write a file), by their words.
PRINTS_NOTHING = {
    "serve", "demo", "db upgrade", "rules import", "rules export", "modules enable", "modules disable",
    "modules priority", "scripts add", "scripts delete", "state reset", "state unlock", "state activate",
    "state deactivate", "rpc", "events serve", "events reprocess", "failures clear", "reprocess create",
    "reprocess cancel", "reprocess run", "backfill", "report chart", "events failures clear",
    *(f"hashmap {kind} delete" for kind in ("service", "field", "group", "mapping", "threshold")),
}
#: Validity windows of a rule or a script (CloudKitty's client's ``--start``/``--end``): no time range.
VALIDITY = {"scripts add", "hashmap mapping create", "hashmap mapping update"}


def _commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()):
    """(words, parser) of every runnable command."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(words), parser
    for action in subs:
        for name, child in action.choices.items():
            yield from _commands(child, (*words, name))


PARSER = build_parser()
COMMANDS = dict(_commands(PARSER))


def _positionals(leaf: argparse.ArgumentParser) -> list[str]:
    """Values filling a command's required positionals and options, so it parses."""
    values = []
    for action in leaf._actions:
        if action.option_strings and action.required:
            values += [action.option_strings[0], str(action.choices[0]) if action.choices else "2026-01-01"]
        elif not action.option_strings and action.nargs not in ("?", "*") and not isinstance(
                action, argparse._SubParsersAction):
            values.append(str(next(iter(action.choices))) if action.choices else "1")
    for group in leaf._mutually_exclusive_groups:  # e.g. reprocess create: --scope or --all
        if group.required:
            first = group._group_actions[0]
            values += [first.option_strings[0], *([] if first.nargs == 0 else ["1"])]
    return values


def test_the_walk_finds_every_command():
    assert {"run", "gaps", "report summary", "hashmap mapping show", "state reset"} <= set(COMMANDS)
    assert not set(PRINTS_NOTHING) - set(COMMANDS), "a command of PRINTS_NOTHING is gone"


@pytest.mark.parametrize("words", sorted(COMMANDS))
def test_every_global_option_parses_before_and_after_the_command(words):
    leaf = COMMANDS[words]
    rest = _positionals(leaf)
    for action in global_actions(PARSER):
        if isinstance(action, argparse._VersionAction):
            continue
        option = action.option_strings[0]
        value = [] if action.nargs == 0 else [action.choices[-1] if action.choices else "x.yaml"]
        expected = True if action.nargs == 0 else value[0]
        before = PARSER.parse_args([option, *value, *words.split(), *rest])
        after = PARSER.parse_args([*words.split(), *rest, option, *value])
        assert getattr(before, action.dest) == expected == getattr(after, action.dest), (words, option)
        # given before, the command's own default does not overwrite it
        assert getattr(PARSER.parse_args([option, *value, *words.split(), *rest]), action.dest) == expected


@pytest.mark.parametrize("words", sorted(set(COMMANDS) - PRINTS_NOTHING))
def test_every_data_printing_command_takes_the_same_formats(words):
    options = COMMANDS[words]._option_string_actions
    assert "-f" in options and options["-f"] is options.get("--format"), words
    assert set(FORMATS) <= set(options["-f"].choices), (words, options["-f"].choices)
    assert options["--json"].dest == "format" and options["--json"].const == "json", words


@pytest.mark.parametrize("words", sorted(set(COMMANDS) - VALIDITY))
def test_every_time_range_has_the_same_names(words):
    options = COMMANDS[words]._option_string_actions
    for canonical, names in ((FROM_OPTIONS[0], FROM_OPTIONS), (TO_OPTIONS[0], TO_OPTIONS)):
        used = [name for name in names if name in options]
        if used:
            assert all(options[name] is options[canonical] for name in names), (words, used)
            assert options[canonical].dest == {"--from": "begin", "--to": "end"}[canonical]
    if "--to" in options:
        assert "--from" in options and "excluded" in (options["--to"].help or ""), words
    assert "--start" not in options, words


def test_reprocess_create_takes_an_excluded_end_as_every_command():
    help_text = COMMANDS["reprocess create"]._option_string_actions["--to"].help
    assert "excluded" in help_text and "included" in help_text  # the schedule row keeps CloudKitty's


def test_filters_take_cloudkittys_colon_beside_the_equals_sign():
    assert key_value("project_id=abc") == ("project_id", "abc")
    assert key_value("project_id:abc") == ("project_id", "abc")
    assert key_value("url=http://x") == ("url", "http://x")
    with pytest.raises(InputError):
        key_value("nothing")


def test_a_config_before_the_command_is_read(tmp_path, capsys):
    """``ratebeam -c x.yaml state list`` used to be refused ("invalid choice: 'x.yaml'")."""
    from pipeline_support import workspace

    config = workspace(tmp_path / "ws")
    assert main(["-c", str(config), "db", "upgrade"]) == 0
    capsys.readouterr()
    assert main(["--log-level", "ERROR", "-c", str(config), "state", "list", "-f", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["state", "list", "--json", "-c", str(config)]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_the_command_reference_is_generated_from_the_parser():
    doc = Path(__file__).parent.parent / "docs" / "cli.md"
    text = doc.read_text(encoding="utf-8")
    assert reference.updated(text, build_parser()) == text, "docs/cli.md is stale: run `make docs`"
    for words in COMMANDS:
        assert f"### `ratebeam {words}`" in text


def test_the_reference_changes_when_a_command_changes():
    parser = build_parser()
    before = reference.generated(parser)
    COMMANDS_OF = dict(_commands(parser))
    COMMANDS_OF["gaps"].add_argument("--new-option", help="something new")
    assert "--new-option" in reference.generated(parser) and "--new-option" not in before
