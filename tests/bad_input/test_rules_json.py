"""Rules JSON (``rules import``, ``rate --rules``): wrong values at every level, JSON json lets through."""

from __future__ import annotations

import pytest

from bad_input.harness import DELETE, Case, check_refused, nested, params, set_json, write

IMPORT = ("rules", "import", "-c", "{c}", "{ws}/bad.json")
MAPPING = ["services", 1, "mappings", 0]           # volume.size's service mapping
FIELD_MAPPING = ["services", 0, "fields", 0, "mappings", 1]
THRESHOLD = ["services", 1, "thresholds", 0]


def _edit(path: list, value: object) -> object:
    """Setup: bad.json, the demo rules with ``path`` set to ``value``."""

    def edit(ws):
        (ws.parent / "bad.json").write_text((ws.parent / "rules.json").read_text())
        set_json("bad.json", path, value)(ws)

    return edit


def _where(path: list) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


NOT_DECIMALS = {"letters": "abc", "empty": "", "nan": "NaN", "inf": "Infinity", "underscore": "1_000",
                "spaces": " 1", "fraction": "1/2", "list": ["1"], "mapping": {"v": 1}, "null": None, "bool": True,
                "comma": "1,5", "hex": "0x10", "huge-exponent": "1e999999999"}
TYPES = {"percent": "percent", "empty": "", "number": 1, "null": None, "upper": "FLAT"}


def _cases() -> list[Case]:
    cases = []
    for where, path in (("mapping", MAPPING), ("field-mapping", FIELD_MAPPING), ("threshold", THRESHOLD)):
        for name, value in NOT_DECIMALS.items():
            cases.append(Case(f"{where}-cost-{name}", _edit([*path, "cost"], value), IMPORT,
                              names=("bad.json", _where([*path, "cost"]))))
        for name, value in TYPES.items():
            cases.append(Case(f"{where}-type-{name}", _edit([*path, "type"], value), IMPORT,
                              names=("bad.json", _where([*path, "type"]))))
        cases.append(Case(f"{where}-unknown-key", _edit([*path, "colour"], "red"), IMPORT,
                          names=("bad.json", _where(path), "colour")))
        cases.append(Case(f"{where}-group-number", _edit([*path, "group"], 5), IMPORT,
                          names=("bad.json", _where([*path, "group"]))))
        cases.append(Case(f"{where}-tenant-empty", _edit([*path, "tenant_id"], ""), IMPORT,
                          names=("bad.json", _where([*path, "tenant_id"]))))
    for name, value in {"letters": "x", "list": [], "null": None}.items():
        cases.append(Case(f"threshold-level-{name}", _edit([*THRESHOLD, "level"], value), IMPORT,
                          names=("bad.json", _where([*THRESHOLD, "level"]))))
    cases += [
        Case("mapping-not-object", _edit(MAPPING, "flat"), IMPORT, names=("bad.json", _where(MAPPING))),
        Case("mappings-not-list", _edit(MAPPING[:-1], {"a": 1}), IMPORT, names=("bad.json", _where(MAPPING[:-1]))),
        Case("mapping-no-cost", _edit([*MAPPING, "cost"], DELETE), IMPORT, names=("bad.json", _where(MAPPING))),
        Case("field-mapping-no-value", _edit([*FIELD_MAPPING, "value"], DELETE), IMPORT,
             names=("bad.json", _where(FIELD_MAPPING))),
        Case("service-mapping-with-value", _edit([*MAPPING, "value"], "x"), IMPORT,
             names=("bad.json", _where(MAPPING))),
        Case("service-no-name", _edit(["services", 2, "name"], DELETE), IMPORT, names=("bad.json", "services[2]")),
        Case("service-name-number", _edit(["services", 2, "name"], 3), IMPORT,
             names=("bad.json", "services[2].name")),
        Case("service-duplicate", _edit(["services", 3], {"name": "instance"}), IMPORT,
             names=("bad.json", "services[3]")),
        Case("field-no-name", _edit(["services", 0, "fields", 0, "name"], DELETE), IMPORT,
             names=("bad.json", "services[0].fields[0]")),
        Case("duplicate-mapping", _edit(["services", 0, "fields", 0, "mappings", 6],
                                        {"value": "m1.tiny", "type": "flat", "cost": "1", "group": "compute"}),
             IMPORT, names=("bad.json", "services[0].fields[0].mappings[6]")),
        Case("services-not-list", _edit(["services"], {"instance": {}}), IMPORT, names=("bad.json", "services")),
        Case("top-unknown-key", _edit(["service"], []), IMPORT, names=("bad.json", "service")),
        Case("groups-not-list", _edit(["groups"], "compute"), IMPORT, names=("bad.json", "groups")),
        Case("undeclared-group", _edit([*MAPPING, "group"], "nowhere"), IMPORT,
             names=("bad.json", _where([*MAPPING, "group"]))),
        Case("json-nan-constant", write("bad.json", '{"services": [{"name": "x", "mappings": '
                                                    '[{"type": "flat", "cost": NaN}]}]}'),
             IMPORT, names=("bad.json", "NaN")),
        Case("json-duplicate-key", write("bad.json", '{"services": [], "services": []}'), IMPORT,
             names=("bad.json", "duplicate key")),
        Case("json-trailing-comma", write("bad.json", '{"services": [],}'), IMPORT, names=("bad.json", "line 1")),
        Case("json-truncated", write("bad.json", '{"services": [{"name": "x"'), IMPORT, names=("bad.json", "line 1")),
        Case("json-single-quotes", write("bad.json", "{'services': []}"), IMPORT, names=("bad.json", "line 1")),
        Case("json-comment", write("bad.json", '{"services": [] // none\n}'), IMPORT, names=("bad.json", "line 1")),
        Case("json-deep", write("bad.json", '{"services": ' + nested(100000) + "}"), IMPORT,
             names=("bad.json", "nested too deeply")),
        Case("json-long-integer", write("bad.json", '{"services": [{"name": "x", "mappings": [{"type": "flat", '
                                                    '"cost": ' + "9" * 5000 + "}]}]}"),
             IMPORT, names=("bad.json: line 1 column 67: services[0].mappings[0].cost: a number has more than 4300 "
                            "digits",)),
        Case("json-long-integer-line-3", write("bad.json", '{"services": [\n {"name": "x", "fields": [{"name": "f", '
                                                           '"mappings": [\n  {"value": "a", "type": "flat", "cost": 1},'
                                                           ' {"value": "b", "type": "flat", "cost": -' + "9" * 5000
                                                           + "}]}]}]}"),
             IMPORT, names=("bad.json: line 3 column 85: services[0].fields[0].mappings[1].cost: a number",)),
        Case("json-surrogate", write("bad.json", '{"services": [{"name": "\\ud800"}]}'), IMPORT,
             names=("bad.json", "surrogate")),
        Case("json-not-utf8", write("bad.json", b'{"services": [{"name": "\xff"}]}'), IMPORT,
             names=("bad.json", "cannot read")),
        Case("json-empty-file", write("bad.json", ""), IMPORT, names=("bad.json",)),
        Case("json-top-list", write("bad.json", "[]"), IMPORT, names=("bad.json",)),
        Case("json-top-string", write("bad.json", '"rules"'), IMPORT, names=("bad.json",)),
        Case("json-two-documents", write("bad.json", '{"services": []}\n{"services": []}'), IMPORT,
             names=("bad.json", "line 2")),
        Case("file-missing", None, ("rules", "import", "-c", "{c}", "{ws}/nope.json"), names=("nope.json",)),
        Case("file-directory", None, ("rules", "import", "-c", "{c}", "{ws}"), names=("{ws}", "cannot read")),
        Case("rate-rules-bad", _edit([*MAPPING, "cost"], "abc"),
             ("rate", "--rules", "{ws}/bad.json", "--usage", "{ws}/usage.csv"),
             names=("bad.json", _where([*MAPPING, "cost"]))),
    ]
    return cases


@pytest.mark.parametrize("case", params(_cases()))
def test_refused(case, workspace_for):
    check_refused(case, workspace_for(case))
