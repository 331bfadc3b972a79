"""PromQL text the Prometheus collector and fetcher send, built exactly as CloudKitty builds it.

Why a module of its own: the query is the contract with CloudKitty (`cloudkitty/collector/prometheus_base.py:115-174`, `cloudkitty/fetcher/prometheus.py:79-148`) and the one
place user data (scope ids, filter values) enters PromQL.  Every label *value* goes through
``quote``, a PromQL double-quoted string literal with backslash, quote and control characters
escaped, so a hostile scope id such as ``p1"} or vector(1) or {x="`` stays one label value (CloudKitty
pastes it raw: a ``"`` or ``{`` makes every query of that scope a parse error and a backslash selects
another label value, `cloudkitty/collector/prometheus_base.py:115-174`).  Label *names* and metric names cannot be quoted in Prometheus 2.x,
so they are checked against the PromQL grammar when the configuration is loaded (``check_label_name``,
``check_metric_name``).

``batchable`` decides whether a metric's query may be sent once for every scope (batched mode):
yes unless its ``query_prefix``/``query_suffix`` could aggregate the scope label away.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ratebeam.transforms.metric_defs import MetricDef, PrometheusExtraArgs

LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    if ord(char) < 0x20 or ord(char) == 0x7F:
        return f"\\x{ord(char):02x}"
    return char


def quote(value: str) -> str:
    """``value`` as a PromQL double-quoted string literal that denotes exactly ``value``."""
    return '"' + "".join(_escape_char(c) for c in value) + '"'


def check_label_name(name: str) -> str:
    """``name`` if it is a valid Prometheus label name, else ``ValueError`` saying so."""
    if not LABEL_NAME.fullmatch(name):
        raise ValueError(f"not a Prometheus label name (expected [a-zA-Z_][a-zA-Z0-9_]*): {name!r}")
    return name


def check_metric_name(name: str) -> str:
    """``name`` if it is a valid Prometheus metric name, else ``ValueError`` saying so."""
    if not METRIC_NAME.fullmatch(name):
        raise ValueError(f"not a Prometheus metric name (expected [a-zA-Z_:][a-zA-Z0-9_:]*): {name!r}")
    return name


def selector(metric: str, matchers: Mapping[str, str]) -> str:
    """``metric{k1="v1", k2="v2"}`` with escaped values; just ``metric`` without matchers."""
    if not matchers:
        return metric
    return metric + "{" + ", ".join(f"{k}={quote(v)}" for k, v in matchers.items()) + "}"


def labels(metric: MetricDef) -> tuple[str, ...]:
    """The ``by (...)`` labels: groupby (scope key included, in order) then metadata (`cloudkitty/collector/prometheus_base.py:115-174`)."""
    return (*metric.groupby, *metric.metadata)


#: A PromQL number literal, optionally signed (``2``, ``-1.5``, ``1e3``, ``.5``).
_NUMBER = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
#: The binary operators that act on each series alone when the other side is a number.
_OPERATOR = r"(?:[-+*/%^]|==|!=|<=|>=|<|>)(?:\s*bool)?"
#: ``query_prefix`` / ``query_suffix`` that only do per-series arithmetic or comparisons with numbers.
_ELEMENTWISE_PREFIX = re.compile(rf"\s*(?:(?:{_NUMBER}\s*{_OPERATOR}|-)\s*)*")
_ELEMENTWISE_SUFFIX = re.compile(rf"\s*(?:{_OPERATOR}\s*{_NUMBER}\s*)*")


def batchable(metric: MetricDef) -> bool:
    """Whether one query for every scope gives each scope exactly its per-scope series.

    The collection query aggregates ``by`` the scope key, so dropping the scope matcher changes
    nothing as long as ``query_prefix``/``query_suffix`` act on each series on its own.  That is
    proven only when they are empty or per-series arithmetic / comparisons with number literals
    (``2 *``, ``/ 3600``, ``> 0``, ``> bool 1``, ``-``): with a number on the other side, PromQL
    applies the operator to each series and keeps its labels.  Anything else (``sum(`` … ``)``,
    ``without``, joins, ``or vector(0)``, function calls) might aggregate or match across scopes, or
    answer a series without the scope label, so the metric is collected per scope.
    """
    args = metric.extra_args if isinstance(metric.extra_args, PrometheusExtraArgs) else PrometheusExtraArgs()
    return bool(_ELEMENTWISE_PREFIX.fullmatch(args.query_prefix) and _ELEMENTWISE_SUFFIX.fullmatch(args.query_suffix))


def collect_query(metric: MetricDef, period: int, scope_key: str, scope_id: str | None) -> str:
    """CloudKitty's collection query (`cloudkitty/collector/prometheus_base.py:115-174`) for one scope, or every scope if ``scope_id`` is None.

    Batched mode is the same query without the scope matcher; the scope key is a ``by`` label, so
    no aggregation ever crosses two scopes.
    """
    args = metric.extra_args if isinstance(metric.extra_args, PrometheusExtraArgs) else PrometheusExtraArgs()
    matchers = {scope_key: scope_id} if scope_id is not None else {}
    query = f"{selector(metric.name, matchers)}[{period}s]"
    if args.range_function:
        query = f"{args.range_function}({query})"
    else:
        query = f"{args.aggregation_method}_over_time({query})"
    if args.query_function:
        query = f"{args.query_function}({query})"
    query = f"{args.aggregation_method}({query}) by ({', '.join(labels(metric))})"
    if args.query_prefix:
        query = f"{args.query_prefix} {query}"
    if args.query_suffix:
        query = f"{query} {args.query_suffix}"
    return query


def fetch_query(metric: str, scope_attribute: str, filters: Iterable[tuple[str, str]] = ()) -> str:
    """The fetcher's scope query (`cloudkitty/fetcher/prometheus.py:79-148`): ``max(metric{filters}) by (scope_attribute)``."""
    return f"max({selector(metric, dict(filters))}) by ({scope_attribute})"
