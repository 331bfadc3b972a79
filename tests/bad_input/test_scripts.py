"""Scripts of the scripted module (``scripts add``): bad documents, texts outside the closed grammar."""

from __future__ import annotations

import json

import pytest

from bad_input.harness import Case, check_refused, nested, params, write

ADD = ("scripts", "add", "-c", "{c}", "{ws}/script.json")


def _script(expr: str, where: str | None = None, target: str = "price") -> object:
    step = {"set": target, "expr": expr} | ({"where": where} if where is not None else {})
    return write("script.json", json.dumps({"name": "s", "steps": [step]}))


#: Texts the scripted language refuses; each must name steps[0].expr (or .where).
EXPRESSIONS = {
    "read-csv": "(SELECT a FROM read_csv('private.csv'))",
    "read-csv-call": "read_csv('private.csv')",
    "scan-parquet": "scan_parquet('x.parquet')",
    "read-json": "read_json('x.json')",
    "read-ndjson": "read_ndjson('x')",
    "read-ipc": "read_ipc('x')",
    "scan-csv": "scan_csv('x')",
    "delta": "read_delta('x')",
    "dollar-quote": "$$'$$ = ''",
    "dollar-tag": "$tag$x$tag$",
    "escape-string": "E'\\x41'",
    "unicode-string": "U&'\\0041'",
    "national-string": "N'x'",
    "hex-string": "X'41'",
    "bit-string": "B'01'",
    "line-comment": "qty -- comment",
    "block-comment": "qty /* c */",
    "semicolon": "qty; DROP TABLE x",
    "select": "SELECT 1",
    "with": "WITH a AS (SELECT 1) SELECT 1",
    "union": "1 UNION SELECT 2",
    "exists": "EXISTS (SELECT 1)",
    "unknown-function": "system('id')",
    "unknown-column": "secret * 2",
    "quoted-unknown-column": '"secret" * 2',
    "unterminated-string": "'abc",
    "unterminated-quoted": '"abc',
    "wrong-arity": "abs(qty, 2)",
    "no-arguments": "round()",
    "string-result": "'abc'",
    "boolean-result": "qty > 1",
    "string-times-number": "unit * 2",
    "dangling-operator": "qty *",
    "empty-parens": "()",
    "unclosed-paren": "(qty",
    "case-without-end": "CASE WHEN qty > 1 THEN 1",
    "cast-unknown-type": "CAST(qty AS blob)",
    "cast-no-as": "CAST(qty)",
    "deep-parens": nested(200, "(", ")").replace("()", "(qty)"),
    "too-many-tokens": " + ".join(["qty"] * 800),
    "control-char": "qty\x07",
    "backtick": "`qty`",
    "question-mark": "qty + ?",
    "colon-param": "qty + :p",
    "at-variable": "@@version",
    "hash": "qty # 1",
}

DOCUMENTS = {
    "not-json": "{name: s}",
    "not-object": "[]",
    "no-name": json.dumps({"steps": [{"set": "price", "expr": "qty"}]}),
    "empty-name": json.dumps({"name": "", "steps": [{"set": "price", "expr": "qty"}]}),
    "no-steps": json.dumps({"name": "s"}),
    "empty-steps": json.dumps({"name": "s", "steps": []}),
    "step-not-object": json.dumps({"name": "s", "steps": ["qty"]}),
    "unknown-key": json.dumps({"name": "s", "steps": [{"set": "price", "expr": "qty"}], "colour": "red"}),
    "step-unknown-key": json.dumps({"name": "s", "steps": [{"set": "price", "expr": "qty", "when": "x"}]}),
    "set-unknown": json.dumps({"name": "s", "steps": [{"set": "cost", "expr": "qty"}]}),
    "expr-number": json.dumps({"name": "s", "steps": [{"set": "price", "expr": 1}]}),
    "expr-empty": json.dumps({"name": "s", "steps": [{"set": "price", "expr": " "}]}),
    "deep-json": nested(100000),
    "long-integer": '{"name": ' + "9" * 5000 + "}",
    "not-utf8": b'{"name": "\xff"}',
}


def _cases() -> list[Case]:
    cases = [Case(f"expr-{name}", _script(text), ADD, names=("script.json", "steps[0].expr"))
             for name, text in EXPRESSIONS.items()]
    cases += [Case(f"where-{name}", _script("qty", where=text), ADD, names=("script.json", "steps[0].where"))
              for name, text in list(EXPRESSIONS.items())[:12]]
    cases += [Case(f"where-not-boolean-{n}", _script("qty", where=text), ADD, names=("script.json", "steps[0].where"))
              for n, text in {"number": "qty", "string": "unit"}.items()]
    cases += [Case(f"document-{name}", write("script.json", text), ADD, names=("script.json",))
              for name, text in DOCUMENTS.items()]
    cases += [
        Case("file-missing", None, ("scripts", "add", "-c", "{c}", "{ws}/nope.json"), names=("nope.json",)),
        Case("bad-start", _script("qty"), (*ADD, "--start", "soon"), names=("--start", "soon")),
        Case("start-empty", _script("qty"), (*ADD, "--start", ""), names=("--start", "''")),
        Case("end-empty", _script("qty"), (*ADD, "--end", ""), names=("--end", "''")),
        Case("start-overflow", _script("qty"), (*ADD, "--start", "0001-01-01T00:00:00+01:00"), names=("--start",)),
        Case("end-before-start", _script("qty"), (*ADD, "--start", "2026-02-01", "--end", "2026-01-01"),
             names=("--end",)),
        Case("delete-unknown", None, ("scripts", "delete", "-c", "{c}", "nope"), names=("nope",)),
    ]
    return cases


@pytest.mark.parametrize("case", params(_cases()))
def test_refused(case, workspace_for):
    ws = workspace_for(case)
    (ws.parent / "private.csv").write_text("secret-token-42\n")
    done = check_refused(case, ws)
    assert "secret-token-42" not in done.out + done.err
