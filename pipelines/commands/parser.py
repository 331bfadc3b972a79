"""The command line's parser class: every option's default in its help, and ``--version``.

Every parser of the CLI is a :class:`RatebeamParser` (``add_subparsers`` makes its sub-parsers of
the same class), so a command added anywhere shows its defaults without repeating them in the help
text, and the help stays in step with the code.
"""

from __future__ import annotations

import argparse
from typing import Any


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an argument's help when it has a default worth saying.

    Unlike ``argparse.ArgumentDefaultsHelpFormatter`` it says nothing for a default of ``None``,
    ``False`` or an empty list (no value: the help says what happens then), and nothing when the
    help text already tells the default in its own words.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (default is None or default is False or default in ([], "", argparse.SUPPRESS) or "default" in text
                or (not action.option_strings and action.nargs not in ("?", "*"))):
            return text
        return f"{text} (default: %(default)s)"


class RatebeamParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose help shows defaults (``DefaultsHelpFormatter``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)


def add_version(parser: argparse.ArgumentParser) -> None:
    """``--version``: the installed package's version (``importlib.metadata``, one source: pyproject)."""
    from importlib.metadata import version

    parser.add_argument("--version", action="version", version=f"%(prog)s {version('ratebeam')}",
                        help="print the version and exit")
