"""The command reference of ``docs/cli.md``, generated from the parser so it cannot drift from it.

``python -m ratebeam.pipelines.commands.reference docs/cli.md`` (``make docs``) rewrites the part of
the file between the two markers; ``--check`` exits 1 when that part differs from what the parser
gives (the test suite runs it), so a command added or changed without regenerating is seen.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

BEGIN = "<!-- BEGIN GENERATED COMMAND REFERENCE (make docs) -->"
END = "<!-- END GENERATED COMMAND REFERENCE -->"


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser, str]]:
    """(path, parser, one-line help) of every runnable command, in the parser's order."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
        for name, child in action.choices.items():
            if child.prog.split()[-1] != name:  # an alias of a command listed already
                continue
            children = [a for a in child._actions if isinstance(a, argparse._SubParsersAction)]
            if children:
                yield from _commands(child, (*path, name))
            else:
                yield (*path, name), child, helps.get(name, "")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _argument(action: argparse.Action) -> str:
    """How an argument is written: its options and its value (``--from FROM``, ``{table,json,csv}``)."""
    if action.option_strings:
        names = ", ".join(f"`{s}`" for s in action.option_strings)
        if action.nargs == 0:
            return names
        value = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else (action.metavar or
                                                                                       action.dest.upper())
        return f"{names} `{value}`"
    if action.choices:
        return "`{" + ",".join(map(str, action.choices)) + "}`"
    return f"`{action.metavar or action.dest.upper()}`" + (" ..." if action.nargs in ("*", "+") else "")


def render(parser: argparse.ArgumentParser, global_options: Sequence[str]) -> str:
    """The reference: per command its help, then a table of its arguments (the global options aside)."""
    from ratebeam.pipelines.commands.parser import DefaultsHelpFormatter

    formatter = DefaultsHelpFormatter("ratebeam")
    out = []
    for path, leaf, help_text in _commands(parser):
        out.append(f"### `ratebeam {' '.join(path)}`\n\n{_cell(help_text or leaf.description or '')}\n")
        rows = []
        for action in leaf._actions:
            if isinstance(action, argparse._HelpAction) or set(action.option_strings) & set(global_options):
                continue
            required = "yes" if action.required or (not action.option_strings and action.nargs not in ("?", "*")) \
                else ""
            help_line = formatter._get_help_string(action) % {"default": action.default} if action.help else ""
            rows.append(f"| {_argument(action)} | {required} | {_cell(help_line)} |")
        if rows:
            out.append("| argument | required | meaning |\n| --- | --- | --- |\n" + "\n".join(rows) + "\n")
    return "\n".join(out)


def generated(parser: argparse.ArgumentParser) -> str:
    """The block between the markers, the markers included."""
    from ratebeam.pipelines.commands.grammar import global_actions

    names = [s for action in global_actions(parser) for s in action.option_strings]
    return f"{BEGIN}\n\n{render(parser, names)}\n{END}"


def updated(text: str, parser: argparse.ArgumentParser) -> str:
    """``text`` with its generated block replaced (``ValueError`` when it lacks the markers)."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the markers {BEGIN!r} and {END!r} are missing")
    return text[:start] + generated(parser) + text[end + len(END):]


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite (or ``--check``) the generated part of the given Markdown file."""
    from ratebeam.pipelines.cli import build_parser

    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("file", nargs="?", default="docs/cli.md", help="the Markdown file (default docs/cli.md)")
    options.add_argument("--check", action="store_true", help="exit 1 if the file is not up to date, change nothing")
    args = options.parse_args(argv)
    path = Path(args.file)
    text = path.read_text(encoding="utf-8")
    new = updated(text, build_parser())
    if args.check:
        if new != text:
            print(f"{path}: the command reference differs from the parser: run `make docs`", file=sys.stderr)
            return 1
        return 0
    if new != text:
        path.write_text(new, encoding="utf-8")
        print(f"{path}: command reference regenerated", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
