"""docs/formats.md stays true: its examples are read by the real readers, its grammars are the code's."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ratebeam.pipelines.interchange.rules import parse_rules
from ratebeam.pipelines.interchange.usage import parse_usage
from ratebeam.transforms import script_parser, skip_expression
from ratebeam.transforms.scripted import load_script
from ratebeam.transforms.skip_expression import parse_skip

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "formats.md").read_text()


def _section(title: str) -> str:
    return DOC.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _blocks(text: str, fence: str = "json") -> list[str]:
    return re.findall(rf"```{fence}\n(.*?)```", text, flags=re.S)


def _grammar_lines(text: str) -> list[str]:
    """The grammar's rules, whitespace normalised (the docstring indents them, the doc does not)."""
    return [" ".join(line.split()) for line in text.strip().splitlines() if line.strip()]


def test_the_rules_example_is_a_valid_rules_file():
    (example,) = _blocks(_section("Rules JSON"))
    rules = parse_rules(example, "formats.md", known_groups=())  # every group it uses is declared
    assert rules.groups == ("instance_uptime", "license")
    assert len(rules.mappings) == 2 and len(rules.thresholds) == 2


def test_the_usage_example_is_a_valid_usage_point():
    (example,) = _blocks(_section("Usage JSONL"))
    frame = parse_usage(json.dumps(json.loads(example)), "formats.md")  # one JSONL line
    assert frame.height == 1


def test_the_rated_example_is_what_rate_prints():
    (example,) = _blocks(_section("Rated JSONL"))
    lines = example.strip().splitlines()
    point, summary = json.loads(" ".join(lines[:2])), json.loads(lines[2])
    assert set(point) == {"i", "type", "scope", "begin", "end", "qty", "price"}
    assert set(summary["summary"]) == {"count", "frames", "errors", "total"}


def test_the_script_example_loads():
    (example,) = _blocks(_section("Scripts of the scripted module"))
    assert load_script(example).name == "windows-fee"


def test_the_script_grammar_is_the_parsers():
    (documented,) = _blocks(_section("Scripts of the scripted module"), fence="text")
    code = script_parser.__doc__.split("::\n", 1)[1].split("\nPrecedence", 1)[0]
    assert _grammar_lines(documented) == _grammar_lines(code)


def test_the_skip_grammar_is_the_parsers_and_its_aliases_parse():
    (documented,) = _blocks(_section("skip_datapoints_expression (metrics.yml)"), fence="text")
    code = skip_expression.__doc__.split("::\n", 1)[1].split("\nCloudKitty aliases", 1)[0]
    assert _grammar_lines(documented) == _grammar_lines(code)
    parse_skip('datapoint.get("vol", {}).get("qty", 0) == 0')  # the documented CloudKitty form
