"""``ratebeam rate --rules R --usage U``: price a usage file with a rules file, no server needed.

Useful to try rules before importing them, and to compare ratebeam with CloudKitty's own hashmap
module on the same input (interchange.md).  Exit status: 0 all rated, 3 when a frame failed (its
points carry ``"price": null`` and the error), 2 on bad input with one line on stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from ratebeam.pipelines.errors import InputError
from ratebeam.pipelines.exit_codes import EXIT_BAD_INPUT, EXIT_FRAME_FAILED, EXIT_OK
from ratebeam.pipelines.interchange import read_rules, read_usage, write_rated
from ratebeam.transforms.hashmap import rate


def run_rate(rules_path: str | Path, usage_path: str | Path, out: TextIO | None = None,
             err: TextIO | None = None) -> int:
    """Rate ``usage_path`` with ``rules_path`` and write rated JSONL to ``out`` (stdout by default).

    Returns the exit status; a bad input file is reported on ``err`` (stderr by default) as
    ``<file>: <where>: <what>``.
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        rules = read_rules(rules_path)
        usage = read_usage(usage_path)
    except InputError as error:
        print(f"ratebeam rate: {error}", file=err)
        return EXIT_BAD_INPUT
    summary = write_rated(usage, rate(usage, rules), out)
    return EXIT_FRAME_FAILED if summary.errors else EXIT_OK
