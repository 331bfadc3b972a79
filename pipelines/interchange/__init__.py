"""The interchange files (``docs/formats.md``): rules JSON, usage JSONL, rated JSONL.

They let a user price usage without any server (``ratebeam rate``), move rules between databases,
and let tests feed ratebeam and CloudKitty the same input.  Each file is parsed as strict JSON
(``document``), then validated by pydantic models through ``ratebeam.pipelines.validation``, so a
refused file is one ``InputError`` naming the file, the JSON path and the value, e.g. ``rules.json:
services[0].fields[1].mappings[2].cost: not a decimal: 'abc'``.  One module per file format.
"""

from ratebeam.pipelines.interchange.rated import RatedSummary, plain_decimal, write_rated
from ratebeam.pipelines.interchange.rules import parse_rules, read_rules, rules_to_json, write_rules
from ratebeam.pipelines.interchange.usage import INDEX, parse_usage, read_usage

__all__ = [
    "INDEX",
    "RatedSummary",
    "parse_rules",
    "parse_usage",
    "plain_decimal",
    "read_rules",
    "read_usage",
    "rules_to_json",
    "write_rated",
    "write_rules",
]
