"""The command line's grammar, said once: global options, time ranges, scopes and filters.

* **Global options** (``-c/--config``, ``-v/--verbose``, ``--log-level``, ``--version``) are read
  before and after the sub-command alike: :func:`spread_global_options` copies them onto every
  command parser once the parser is built, so a command added later gets them too.
* **Time ranges** are ``--from`` and ``--to``, the end excluded, on every command
  (:func:`add_time_range`).  ``--begin``/``--end`` (``openstack rating summary get``'s names) and
  ``--since`` are accepted as aliases of the same options, with the same meaning.  CloudKitty's
  inclusive end lives on where its API is served (``POST /v2/task/reprocesses``), not here.
* **Scopes and filters**: ``--scope ID`` (repeatable) selects scopes wherever scopes are selected;
  ``--filter KEY=VALUE`` also takes CloudKitty's ``KEY:VALUE`` (:func:`key_value`).

Output formats (``-f table|json|csv``, ``--json``) live in ``output``; exit statuses in ``exit_codes``.
"""

from __future__ import annotations

import argparse
import os

from ratebeam.pipelines.errors import InputError

#: The option names of a time range: the canonical one first, then the aliases kept.
FROM_OPTIONS = ("--from", "--begin", "--since")
TO_OPTIONS = ("--to", "--end")
#: The environment variable naming the configuration when ``-c`` is not given.
CONFIG_ENV = "RATEBEAM_CONFIG"


class _Spelled(argparse._StoreAction):
    """Stores the value and the spelling used (``--begin`` or ``--from``), so errors name what was typed."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        spellings = dict(getattr(namespace, "spellings", {}))
        spellings[self.dest] = option_string
        namespace.spellings = spellings


def spelled(args: argparse.Namespace, dest: str) -> str:
    """The option the user typed for ``dest`` (``begin``/``end``), else its canonical name."""
    typed = getattr(args, "spellings", {}).get(dest)
    return typed or {"begin": FROM_OPTIONS[0], "end": TO_OPTIONS[0]}[dest]


def add_time_range(parser: argparse.ArgumentParser, *, required: bool = False,
                   from_help: str = "first period (ISO-8601)",
                   to_help: str | None = "end of the range, excluded (ISO-8601)") -> None:
    """``--from`` (dest ``begin``) and, unless ``to_help`` is None, ``--to`` (dest ``end``), with their aliases."""
    parser.add_argument(*FROM_OPTIONS, dest="begin", required=required, metavar="FROM", help=from_help,
                        action=_Spelled)
    if to_help is not None:
        parser.add_argument(*TO_OPTIONS, dest="end", required=required, metavar="TO", help=to_help, action=_Spelled)


def key_value(item: str, what: str = "--filter") -> tuple[str, str]:
    """``KEY=VALUE`` or CloudKitty's ``KEY:VALUE`` (the first ``=``, else the first ``:``, splits)."""
    for sep in ("=", ":"):
        key, found, value = item.partition(sep)
        if found and key:
            return key, value
    raise InputError("command line", what, "expected KEY=VALUE (or KEY:VALUE)", item)


def config_path(value: str | None) -> str:
    """The configuration file: ``-c``, else ``$RATEBEAM_CONFIG``, else ``./ratebeam.yaml``."""
    return value or os.environ.get(CONFIG_ENV) or "ratebeam.yaml"


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """The options read before the sub-command (and, through ``spread_global_options``, after it)."""
    from ratebeam.pipelines.commands.logs import add_log_arguments
    from ratebeam.pipelines.commands.parser import add_version

    parser.add_argument("-c", "--config", help=f"ratebeam.yaml (default: ${CONFIG_ENV}, else ./ratebeam.yaml)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging (as --log-level DEBUG)")
    add_log_arguments(parser)
    add_version(parser)


def global_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The top parser's global options (every optional action but ``--help``)."""
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def leaf_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every runnable command's parser (one without sub-commands of its own)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [parser]
    return [leaf for action in subs for child in dict.fromkeys(action.choices.values()) for leaf in leaf_parsers(child)]


def spread_global_options(top: argparse.ArgumentParser) -> None:
    """Make every global option of ``top`` work after the sub-command too.

    Each command parser gets the option (or keeps its own of the same name, such as ``rate -c``)
    with no default of its own (``SUPPRESS``), so a value given before the sub-command is never
    overwritten by the command's default.
    """
    for leaf in leaf_parsers(top):
        own = leaf._option_string_actions
        for action in global_actions(top):
            present = [own[s] for s in action.option_strings if s in own]
            if present:
                for mine in present:
                    mine.default = argparse.SUPPRESS
                continue
            kwargs: dict = {"dest": action.dest, "help": action.help, "default": argparse.SUPPRESS}
            if isinstance(action, argparse._VersionAction):
                leaf.add_argument(*action.option_strings, action="version", version=action.version, help=action.help)
            elif isinstance(action, argparse._StoreTrueAction):
                leaf.add_argument(*action.option_strings, action="store_true", **kwargs)
            else:
                leaf.add_argument(*action.option_strings, type=action.type, choices=action.choices,
                                  metavar=action.metavar, **kwargs)
