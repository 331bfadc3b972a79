"""The closed grammar of scripted-rating expressions: tokenizer and recursive-descent parser.

A script step's text never reaches a SQL engine: compiling SQL text with Polars already runs the
table functions it names (``read_csv('/etc/...')`` opens the file), and a filter in front of the
engine has to know every quoting form the engine does.  So the text is parsed here into a small
syntax tree that can only name the operations of the language (``transforms.script_compiler``
turns it into a Polars expression).  Anything else is an ``ExpressionError`` naming the column:
sub-queries (``SELECT``, ``FROM``, ``WITH``...), unknown or table functions (``read_csv``,
``scan_parquet``...), dollar-quoted strings (``$$...$$``, ``$tag$...$tag$``), prefixed strings
(``E'...'``, ``U&'...'``, ``N''``, ``X''``, ``B''``), comments (``--``, ``/* */``), ``;``.

Syntax (keywords and function names are case-insensitive, column names are not)::

    expr     := operand ( infix operand )*          # precedence below, left-associative
    infix    := OR | AND | comparison | + | - | * | / | % | :: type
              | [NOT] IN "(" expr ( "," expr )* ")" | [NOT] BETWEEN expr AND expr
              | [NOT] LIKE string | [NOT] ILIKE string | IS [NOT] NULL
    operand  := NUMBER | STRING | TRUE | FALSE | NULL | column | "(" expr ")"
              | NOT expr | - expr | + expr | CAST "(" expr AS type ")"
              | EXTRACT "(" part FROM expr ")" | CASE [expr] (WHEN expr THEN expr)+ [ELSE expr] END
              | function "(" [ expr ( "," expr )* ] ")"
    column   := scope_id | type | begin | end | qty | price | unit | "groupby.<key>" | "metadata.<key>"
    type     := DECIMAL|DEC|NUMERIC [ "(" p [ "," s ] ")" ] | TINYINT | SMALLINT | INT2 | INT | INTEGER
              | INT4 | BIGINT | INT8 | REAL | FLOAT4 | FLOAT | FLOAT8 | DOUBLE [PRECISION]
              | VARCHAR [ "(" n ")" ] | TEXT | STRING | CHAR | BOOLEAN | BOOL
    NUMBER   := digits [ "." [digits] ] [ e [+-] digits ] | "." digits [ e [+-] digits ]
    STRING   := '...' ('' is a quote; a backslash is a backslash)

Precedence, loosest first (the one of Polars' SQL parser, so texts keep their meaning): OR, AND,
NOT, IS, LIKE/ILIKE, comparisons/IN/BETWEEN, + -, * / %, unary - +, ``::``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from ratebeam.transforms.schema import CORE_COLUMNS, GROUPBY_PREFIX, METADATA_PREFIX
from ratebeam.transforms.script_syntax import (
    Between,
    Binary,
    Call,
    Case,
    Cast,
    Column,
    Const,
    ExpressionError,
    InList,
    IsNull,
    Like,
    Node,
    Number,
    Str,
    Unary,
    walk,
)

MAX_DEPTH = 64  # nesting limit: a deeper text is refused, never a RecursionError
MAX_TOKENS = 1000  # a step is a formula: a longer text is refused before Polars sees a huge tree


#: Functions of the language and their number of arguments (None: one or more).
FUNCTIONS: dict[str, tuple[int, ...] | None] = {
    "abs": (1,), "sign": (1,), "floor": (1,), "ceil": (1,), "ceiling": (1,), "round": (1, 2),
    "coalesce": None, "greatest": None, "least": None, "nullif": (2,), "if": (3,),
    "upper": (1,), "lower": (1,), "initcap": (1,), "length": (1,), "char_length": (1,),
    "octet_length": (1,), "reverse": (1,), "trim": (1,), "ltrim": (1,), "rtrim": (1,),
    "substr": (2, 3), "substring": (2, 3), "replace": (3,), "starts_with": (2,), "ends_with": (2,),
    "split_part": (3,), "strpos": (2,), "date_part": (2,), "strftime": (2,),
}
COLUMNS = frozenset(CORE_COLUMNS)
_SUBQUERY_WORDS = frozenset({"select", "from", "with", "union", "values", "table", "exists", "lateral",
                             "join", "where", "having", "recursive", "unnest", "any", "all", "some"})
_TABLE_FUNCTION = re.compile(r"(?:read|scan)_\w*|\w*(?:parquet|csv|json|ipc|delta|iceberg)\w*", re.IGNORECASE)
_RESERVED = frozenset({"and", "or", "not", "in", "is", "null", "true", "false", "between", "like", "ilike",
                       "case", "when", "then", "else", "cast", "as", "extract"})
_COMPARISONS = {"=": "=", "<>": "<>", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_PRECEDENCE = {"or": 5, "and": 10, "is": 17, "like": 19, "ilike": 19, "in": 20, "between": 20,
               "+": 30, "-": 30, "*": 40, "/": 40, "%": 40, "::": 50} | dict.fromkeys(_COMPARISONS, 20)
_UNARY_NOT, _UNARY_SIGN = 15, 40


# ---- tokenizer ----

_TOKEN = re.compile(
    r"""(?P<ws>[ \t\r\n]+)
    | (?P<comment>--|/\*)
    | (?P<prefixed>(?i:u&['"]|[enxb]'))
    | (?P<number>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)
    | (?P<string>'(?:[^']|'')*')
    | (?P<quoted>"(?:[^"]|"")*")
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<op><=|>=|<>|!=|::|[-+*/%<>=(),])
    """,
    re.VERBOSE,
)
_REFUSED_CHARS = {
    "$": "dollar-quoted strings and parameters are not supported",
    ";": "';' is not supported (a step is one expression)",
    "'": "unterminated string",
    '"': "unterminated quoted column name",
}


@dataclass(frozen=True)
class Token:
    """One lexical unit of the text, with its 1-based column for error messages."""

    kind: str  # number | string | quoted | name | op | end
    text: str
    pos: int

    @property
    def word(self) -> str:
        """The lower-cased text of a bare name (keywords are case-insensitive), else ``""``."""
        return self.text.lower() if self.kind == "name" else ""

    def describe(self) -> str:
        """How an error message names this token."""
        return "the end of the expression" if self.kind == "end" else repr(self.text)


def tokenize(text: str) -> list[Token]:
    """The tokens of ``text``; ``ExpressionError`` at the first character outside the language."""
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        kind = match.lastgroup if match else None
        if kind == "comment":
            raise ExpressionError("comments are not supported", pos + 1)
        if kind == "prefixed":
            raise ExpressionError("prefixed strings (E'', U&'', N'', X'', B'') are not supported", pos + 1)
        if match is None or kind is None:
            char = text[pos]
            raise ExpressionError(_REFUSED_CHARS.get(char, f"unexpected character {char!r}"), pos + 1)
        if kind != "ws":
            tokens.append(Token(kind, match.group(), pos + 1))
        pos = match.end()
        if len(tokens) > MAX_TOKENS:
            raise ExpressionError(f"expression longer than {MAX_TOKENS} tokens", pos + 1)
    tokens.append(Token("end", "", len(text) + 1))
    return tokens


# ---- parser ----


def parse(text: str) -> Node:
    """The syntax tree of one expression; ``ExpressionError`` if ``text`` is not in the language."""
    tree = _Parser(tokenize(text)).parse()
    for node, height in walk(tree):  # the compiler recurses over the tree: bound its height
        if height > MAX_DEPTH:
            raise ExpressionError(f"expression nested more than {MAX_DEPTH} levels deep", node.pos)
    return tree


class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.index = 0
        self.depth = 0

    @property
    def tok(self) -> Token:
        return self.tokens[self.index]

    def advance(self) -> Token:
        token = self.tok
        self.index += 1
        return token

    def error(self, reason: str, token: Token | None = None) -> ExpressionError:
        token = token or self.tok
        if token.word in _SUBQUERY_WORDS:
            reason = "sub-queries and table functions are refused"
        return ExpressionError(f"{reason}: found {token.describe()}", token.pos)

    def at_word(self, *words: str) -> bool:
        return self.tok.word in words

    def take_word(self, word: str) -> bool:
        if self.tok.word == word:
            self.index += 1
            return True
        return False

    def expect_word(self, word: str) -> None:
        if not self.take_word(word):
            raise self.error(f"expected {word.upper()}")

    def take_op(self, op: str) -> bool:
        if self.tok.kind == "op" and self.tok.text == op:
            self.index += 1
            return True
        return False

    def expect_op(self, op: str) -> None:
        if not self.take_op(op):
            raise self.error(f"expected {op!r}")

    def parse(self) -> Node:
        node = self.expr()
        if self.tok.kind != "end":
            raise self.error("expected an operator or the end of the expression")
        return node

    def expr(self, precedence: int = 0) -> Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExpressionError(f"expression nested more than {MAX_DEPTH} levels deep", self.tok.pos)
        left = self.operand()
        while precedence < self.next_precedence():
            left = self.infix(left)
        self.depth -= 1
        return left

    def next_precedence(self) -> int:
        token = self.tok
        if token.kind == "op":
            return _PRECEDENCE.get(token.text, 0)
        if token.word == "not":
            following = self.tokens[self.index + 1].word
            return _PRECEDENCE[following] if following in ("in", "between", "like", "ilike") else 0
        return _PRECEDENCE.get(token.word, 0)

    def infix(self, left: Node) -> Node:
        token = self.advance()
        op = token.text if token.kind == "op" else token.word
        if op == "::":
            return Cast(token.pos, left, self.data_type())
        if op == "is":
            negated = self.take_word("not")
            if not self.take_word("null"):
                raise self.error("expected NULL or NOT NULL after IS")
            return IsNull(token.pos, left, negated)
        negated = op == "not"
        if negated:
            op = self.advance().word
        if op == "in":
            self.expect_op("(")
            items = [self.expr()]
            while self.take_op(","):
                items.append(self.expr())
            self.expect_op(")")
            return InList(token.pos, left, tuple(items), negated)
        if op == "between":
            low = self.expr(_PRECEDENCE["between"])
            self.expect_word("and")
            return Between(token.pos, left, low, self.expr(_PRECEDENCE["between"]), negated)
        if op in ("like", "ilike"):
            return Like(token.pos, left, self.expr(_PRECEDENCE["like"]), negated, op == "ilike")
        return Binary(token.pos, _COMPARISONS.get(op, op), left, self.expr(_PRECEDENCE[op]))

    def operand(self) -> Node:
        token = self.tok
        if token.kind in ("number", "string", "quoted"):
            self.index += 1
            if token.kind == "number":
                return Number(token.pos, token.text)
            body = token.text[1:-1]
            if token.kind == "string":
                return Str(token.pos, body.replace("''", "'"))
            return self.column(token, body.replace('""', '"'))
        if self.take_op("("):
            node = self.expr()
            self.expect_op(")")
            return node
        if token.kind == "op" and token.text in ("-", "+"):
            self.index += 1
            return Unary(token.pos, token.text, self.expr(_UNARY_SIGN))
        if token.kind != "name":
            raise self.error("expected a value, a column, a function or '('")
        self.index += 1
        word = token.word
        if word == "not":
            return Unary(token.pos, "not", self.expr(_UNARY_NOT))
        if word in ("true", "false", "null"):
            return Const(token.pos, {"true": True, "false": False, "null": None}[word])
        if word == "case":
            return self.case(token)
        if word in ("cast", "extract") or self.tok.text == "(":
            return self.call(token)
        if word in _RESERVED or word in _SUBQUERY_WORDS:
            raise self.error("expected a value, a column, a function or '('", token)
        return self.column(token, token.text)

    def column(self, token: Token, name: str) -> Column:
        if name in COLUMNS or name.startswith((GROUPBY_PREFIX, METADATA_PREFIX)):
            return Column(token.pos, name)
        raise ExpressionError(f"unknown column {name!r} (a script reads {', '.join(CORE_COLUMNS)} and "
                              '"groupby.<key>" / "metadata.<key>")', token.pos)

    def case(self, token: Token) -> Case:
        operand = None if self.at_word("when") else self.expr()
        branches = []
        while self.take_word("when"):
            condition = self.expr()
            self.expect_word("then")
            branches.append((condition, self.expr()))
        if not branches:
            raise self.error("expected WHEN")
        default = self.expr() if self.take_word("else") else None
        self.expect_word("end")
        return Case(token.pos, operand, tuple(branches), default)

    def call(self, token: Token) -> Node:
        word = token.word
        if word in _SUBQUERY_WORDS or _TABLE_FUNCTION.fullmatch(word):
            raise ExpressionError(f"sub-queries and table functions are refused: found {token.text!r}", token.pos)
        if word not in FUNCTIONS and word not in ("cast", "extract"):
            raise ExpressionError(f"unsupported function {token.text!r} (only row-wise operations are allowed: "
                                  "no aggregates, windows or sub-queries)", token.pos)
        self.expect_op("(")
        if word == "cast":
            operand = self.expr()
            self.expect_word("as")
            node: Node = Cast(token.pos, operand, self.data_type())
        elif word == "extract":
            part = self.advance()
            if part.kind != "name":
                raise self.error("expected a date part such as YEAR", part)
            self.expect_word("from")
            node = Call(token.pos, "date_part", (Str(part.pos, part.text), self.expr()))
        else:
            args = [] if self.tok.text == ")" else [self.expr()]
            while self.take_op(","):
                args.append(self.expr())
            counts = FUNCTIONS[word]
            if (counts is None and not args) or (counts is not None and len(args) not in counts):
                expected = "one or more" if counts is None else " or ".join(map(str, counts))
                raise ExpressionError(f"{word.upper()} takes {expected} argument(s), not {len(args)}", token.pos)
            node = Call(token.pos, word, tuple(args))
        self.expect_op(")")
        return node

    def data_type(self) -> pl.DataType:
        token = self.advance()
        word = token.word
        if word in ("decimal", "dec", "numeric"):
            params = self.type_params(2)
            precision, scale = (params[0], params[1] if len(params) == 2 else 0) if params else (38, 9)
            if not 1 <= precision <= 38 or scale > precision:
                raise ExpressionError(f"DECIMAL({precision}, {scale}) is not a decimal type (precision 1 to 38, "
                                      "scale at most the precision)", token.pos)
            return pl.Decimal(precision, scale)
        if word == "double":
            self.take_word("precision")
            return pl.Float64()
        if word in ("varchar", "char"):
            self.type_params(1)
            return pl.String()
        simple = {"tinyint": pl.Int8, "smallint": pl.Int16, "int2": pl.Int16, "int": pl.Int32,
                  "integer": pl.Int32, "int4": pl.Int32, "bigint": pl.Int64, "int8": pl.Int64,
                  "real": pl.Float32, "float4": pl.Float32, "float": pl.Float64, "float8": pl.Float64,
                  "text": pl.String, "string": pl.String, "boolean": pl.Boolean, "bool": pl.Boolean}
        if word not in simple:
            raise self.error("expected a type (DECIMAL(p, s), INT, BIGINT, DOUBLE, VARCHAR, BOOLEAN...)", token)
        return simple[word]()

    def type_params(self, most: int) -> list[int]:
        if not self.take_op("("):
            return []
        params: list[int] = []
        while True:
            token = self.advance()
            if token.kind != "number" or not token.text.isdigit() or len(token.text) > 3 or len(params) == most:
                raise self.error("expected a whole number", token)
            params.append(int(token.text))
            if not self.take_op(","):
                break
        self.expect_op(")")
        return params
