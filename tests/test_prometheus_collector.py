"""The Prometheus collector against a real Prometheus 2.42 holding generated history (tests/servers).

Every expected quantity is computed here from the generated samples (``servers.prometheus.SERIES``):
the ``*_over_time`` fold by hand, then CloudKitty's 9-significant-digit half-up rule.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Context, Decimal

import pytest
from prometheus_support import collector, expected, metric, period, qty, rows, usage
from servers import prometheus as servers_prometheus
from servers.prometheus import HOSTILE, NEWLINE, SCOPES, VOLUME_BY_HOUR, WEIRD, free_port, series

from ratebeam.connectors.collectors.prometheus.client import (
    PrometheusClient,
    PrometheusConnection,
    PrometheusQueryError,
)
from ratebeam.connectors.collectors.prometheus.promql import batchable, collect_query, quote
from ratebeam.connectors.errors import NoDataCollected, RetriableConnectorError
from ratebeam.transforms.convert_usage import convert_samples
from ratebeam.transforms.metric_defs import PROMETHEUS_AGGREGATIONS
from ratebeam.transforms.schema import TIME_KEYS, groupby_column, usage_schema

NINE = Context(prec=9, rounding=ROUND_HALF_UP)
prometheus_server = servers_prometheus.prometheus_server  # the session fixture


# ---- the query text (CloudKitty's, `cloudkitty/collector/prometheus_base.py:115-174`) ----


def test_query_is_cloudkittys():
    status = metric("openstack_nova_server_status", groupby=["id", "flavor_name"], metadata=["os_distro"])
    assert collect_query(status, 3600, "project_id", "p1") == (
        'max(max_over_time(openstack_nova_server_status{project_id="p1"}[3600s])) '
        "by (id, flavor_name, project_id, os_distro)"
    )
    fancy = metric("m", groupby=["id"], extra_args={
        "range_function": "rate", "query_function": "ceil", "aggregation_method": "sum",
        "query_prefix": "2 *", "query_suffix": "> 1"})
    assert collect_query(fancy, 600, "project_id", "p1") == (
        '2 * sum(ceil(rate(m{project_id="p1"}[600s]))) by (id, project_id) > 1'
    )
    assert collect_query(fancy, 600, "project_id", None) == "2 * sum(ceil(rate(m[600s]))) by (id, project_id) > 1"


def test_label_values_are_quoted_promql_strings():
    assert quote(HOSTILE) == '"p1\\"} or vector(1) or {x=\\""'
    assert quote(WEIRD) == '"a\\\\b{c}\\"d"'
    assert quote(NEWLINE) == '"line\\nbreak"'
    assert quote("tab\tbell\x07") == '"tab\\tbell\\x07"'


# ---- points ----


def test_several_scopes_labels_and_missing_labels(prometheus_server):
    up = metric("ratebeam_instance_up", groupby=["id"], metadata=["flavor_name", "os_distro"], unit="instance",
                alt_name="instance")
    col = collector(prometheus_server.api)
    for hour in range(4):
        begin, end = period(hour)
        for scope in ("p1", "p2"):
            got = usage(col, scope, begin, end, up)
            assert got.columns == usage_schema(up.groupby, up.metadata).names + [groupby_column(k) for k in TIME_KEYS]
            want = sorted(
                (s.labels["id"], s.labels["flavor_name"], s.labels.get("os_distro", ""), qty(expected(s, "max", hour), up))
                for s in series("ratebeam_instance_up", project_id=scope)
            )
            assert sorted(got.select("groupby.id", "metadata.flavor_name", "metadata.os_distro", "qty").rows()) == want
            assert set(got["scope_id"]) == {scope} and set(got["groupby.project_id"]) == {scope}
            assert set(got["type"]) == {"instance"} and set(got["unit"]) == {"instance"}
            assert set(got["price"]) == {Decimal(0)}
            assert set(got["begin"]) == {begin} and set(got["end"]) == {end}
            assert got["groupby.year"][0] == "2026" and got["groupby.day_of_the_year"][0] == "1"
    p2 = usage(col, "p2", *period(0), up)
    assert p2["metadata.os_distro"].to_list() == [""]  # missing label -> '' (CloudKitty)


@pytest.mark.parametrize("agg", sorted(PROMETHEUS_AGGREGATIONS))
def test_aggregation_methods(prometheus_server, agg):
    volume = metric("ratebeam_volume_bytes", groupby=["id"], extra_args={"aggregation_method": agg})
    col = collector(prometheus_server.api)
    for hour in range(4):
        for scope in ("p1", "p2"):
            (s,) = series("ratebeam_volume_bytes", project_id=scope)
            got = usage(col, scope, *period(hour), volume)
            assert got["qty"].to_list() == [qty(expected(s, agg, hour), volume)], (agg, hour, scope)


def test_nine_significant_digits_half_up(prometheus_server):
    volume = metric("ratebeam_volume_bytes", groupby=["id"])
    col = collector(prometheus_server.api)
    got = [usage(col, "p1", *period(h), volume)["qty"][0] for h in range(4)]
    assert got == [NINE.plus(Decimal(repr(v))) for v in VOLUME_BY_HOUR]
    # CloudKitty's own examples: 123456789.55 -> 123456790; a tie rounds up (half-up, not half-even)
    assert got[0] == Decimal("123456790") and got[1] == Decimal("123456789")
    assert got[2] == Decimal("12345678900") and got[3] == Decimal("0.123456789")


def test_factor_and_offset_in_the_nine_digit_context(prometheus_server):
    volume = metric("ratebeam_volume_bytes", groupby=["id"], factor="1/3", offset=0.5)
    got = usage(collector(prometheus_server.api), "p1", *period(0), volume)["qty"][0]
    third = Decimal(1 / 3)  # num2decimal of the fraction: the float's exact binary expansion
    assert got == NINE.add(NINE.multiply(Decimal("123456790"), third), Decimal("0.5"))


@pytest.mark.parametrize(
    ("mutate", "extra", "raw_to_qty"),
    [
        ("NUMBOOL", {}, lambda v: Decimal(int(v != 0))),
        ("NOTNUMBOOL", {}, lambda v: Decimal(int(v == 0))),
        ("MAP", {"mutate_map": {1: 0.5, 0: 7}}, lambda v: Decimal("0.5") if v == 1 else Decimal(7)),
    ],
)
def test_mutators_on_up_metric(prometheus_server, mutate, extra, raw_to_qty):
    up = metric("ratebeam_instance_up", groupby=["id"], mutate=mutate, **extra)
    col = collector(prometheus_server.api)
    for hour in range(4):
        got = dict(usage(col, "p1", *period(hour), up).select("groupby.id", "qty").rows())
        want = {s.labels["id"]: raw_to_qty(expected(s, "max", hour)) for s in series("ratebeam_instance_up", project_id="p1")}
        assert got == want


@pytest.mark.parametrize("mutate", ["FLOOR", "CEIL"])
def test_floor_and_ceil(prometheus_server, mutate):
    volume = metric("ratebeam_volume_bytes", groupby=["id"], mutate=mutate, factor="1/1000")
    col = collector(prometheus_server.api)
    rounding = math.floor if mutate == "FLOOR" else math.ceil
    for hour in range(4):
        got = usage(col, "p1", *period(hour), volume)["qty"][0]
        scaled = NINE.multiply(NINE.plus(Decimal(repr(VOLUME_BY_HOUR[hour]))), Decimal(1 / 1000))
        assert got == Decimal(rounding(scaled))


@pytest.mark.parametrize(
    ("function", "fn"),
    [("abs", abs), ("ceil", math.ceil), ("floor", math.floor), ("exp", math.exp),
     ("ln", math.log), ("log2", math.log2), ("log10", math.log10), ("sqrt", math.sqrt),
     ("round", lambda v: math.floor(v + 0.5))],  # PromQL round(): ties toward +Inf
)
def test_query_functions(prometheus_server, function, fn):
    load = metric("ratebeam_load", groupby=["host"], extra_args={"query_function": function})
    col = collector(prometheus_server.api)
    for scope in ("p1", "p2"):
        (s,) = series("ratebeam_load", project_id=scope)
        value = expected(s, "max", 1)
        try:
            want = qty(float(fn(value)), load)
        except ValueError:  # log/sqrt of a negative: NaN in PromQL -> no point
            want = None
        if want is None:
            with pytest.raises(NoDataCollected):
                col.collect(scope, *period(1), load)
        else:
            assert usage(col, scope, *period(1), load)["qty"].to_list() == [want], (function, scope)


# the counters grow by `slope` per second, one sample a minute, 60 samples in each hour window
# whose first and last samples sit 30 s inside the window (so Prometheus extrapolates to the edges)
@pytest.mark.parametrize(
    ("function", "per_slope"),
    [("rate", 1), ("irate", 1), ("deriv", 1), ("delta", 3600), ("idelta", 60), ("changes", None)],
)
def test_range_functions_on_counters(prometheus_server, function, per_slope):
    net = metric("ratebeam_net_bytes_total", groupby=["interface"], extra_args={"range_function": function})
    col = collector(prometheus_server.api)
    for scope in ("p1", "p2"):
        (s,) = series("ratebeam_net_bytes", project_id=scope)
        slope = (s.values[1] - s.values[0]) / 60
        for hour in range(1, 4):
            window = s.window(period(hour)[1], 3600)
            raw = len(window) - 1 if per_slope is None else slope * per_slope
            assert usage(col, scope, *period(hour), net)["qty"].to_list() == [qty(raw, net)], (scope, hour)


def test_a_function_prometheus_refuses_fails_with_the_query_and_message(prometheus_server):
    # irange is allowed by CloudKitty's schema but is not a PromQL function
    net = metric("ratebeam_net_bytes_total", extra_args={"range_function": "irange"})
    with pytest.raises(PrometheusQueryError) as info:
        collector(prometheus_server.api).collect("p1", *period(1), net)
    assert "irange" in info.value.message and info.value.query.startswith("max(irange(")
    assert "bad_data" in str(info.value)


def test_prefix_and_suffix(prometheus_server):
    volume = metric("ratebeam_volume_bytes", groupby=["id"],
                    extra_args={"query_prefix": "2 *", "query_suffix": "> 1"})
    col = collector(prometheus_server.api)
    for hour in range(3):
        assert usage(col, "p1", *period(hour), volume)["qty"][0] == NINE.plus(
            Decimal(repr(2 * VOLUME_BY_HOUR[hour])))
    with pytest.raises(NoDataCollected):  # 2 * 0.1234567891 is not > 1
        col.collect("p1", *period(3), volume)


# ---- which metrics may be batched (one query for all scopes) ----

#: (query_prefix, query_suffix) that act on each series alone: batched, and exact.
ELEMENTWISE = [("", ""), ("2 *", "> 1"), ("-", ""), ("", "/ 1024 ^ 3"), ("1 -", "< bool 0"), ("  ", "* -1.5e3 >= 2")]
#: Not proven to keep each scope's series: collected per scope (the first two do merge scopes).
NOT_PROVEN = [("sum(", ")"), ("", "or vector(0)"), ("sum without (project_id) (", ")"), ("abs(", ")"),
              ("", "* on(id) group_left ratebeam_load"), ("", "> 0 and ratebeam_load"), ("(", ") * 2"),
              ("", "atan2 1"), ("topk(1,", ")"), ("", "offset 1h")]


def per_scope_and_batched(col, m, hour: int) -> tuple[dict, dict]:
    """Each scope's points from its own query, and from the one query for all scopes."""
    found = col.collect_all(*period(hour), m)
    alone = {}
    for scope in SCOPES:
        try:
            alone[scope] = usage(col, scope, *period(hour), m)
        except NoDataCollected:
            continue
    return alone, {s: rows(convert_samples(b, [m], col.numeric_context)) for s, b in found.items()}


@pytest.mark.parametrize(("prefix", "suffix"), ELEMENTWISE)
def test_elementwise_prefix_and_suffix_are_batched_and_exact(prometheus_server, prefix, suffix):
    volume = metric("ratebeam_volume_bytes", groupby=["id"], extra_args={"query_prefix": prefix, "query_suffix": suffix})
    assert batchable(volume)
    col = collector(prometheus_server.api)
    for hour in range(4):
        alone, batched = per_scope_and_batched(col, volume, hour)
        assert set(alone) == set(batched)
        assert all(alone[s].equals(batched[s]) for s in alone), hour
    if (prefix, suffix) == ("", ""):
        assert len(alone) == 2  # p1 and p2 have volumes: the comparison is not between empty answers


@pytest.mark.parametrize(("prefix", "suffix"), NOT_PROVEN)
def test_other_prefixes_and_suffixes_are_not_batched(prefix, suffix):
    assert not batchable(metric("m", extra_args={"query_prefix": prefix, "query_suffix": suffix}))


def test_a_prefix_that_aggregates_scopes_would_lose_usage_if_batched(prometheus_server):
    """Why ``sum(`` … ``)`` stays per scope: for all scopes at once it merges them into one unlabelled
    series, which belongs to no scope."""
    volume = metric("ratebeam_volume_bytes", groupby=["id"], extra_args={"query_prefix": "sum(", "query_suffix": ")"})
    alone, batched = per_scope_and_batched(collector(prometheus_server.api), volume, 0)
    assert set(alone) == {"p1", "p2"} and batched == {}


# ---- a hostile scope id selects its own series and nothing else ----


@pytest.mark.parametrize("scope", [HOSTILE, WEIRD, NEWLINE])
def test_hostile_scope_ids_select_exactly_their_series(prometheus_server, scope):
    up = metric("ratebeam_instance_up", groupby=["id"], metadata=["flavor_name"])
    got = usage(collector(prometheus_server.api), scope, *period(0), up)
    (own,) = series("ratebeam_instance_up", project_id=scope)
    assert got["groupby.id"].to_list() == [own.labels["id"]]
    assert got["scope_id"].to_list() == [scope] and got["groupby.project_id"].to_list() == [scope]


def test_cloudkittys_unquoted_query_would_break(prometheus_server):
    """Why quoting matters: the same scope pasted raw is a parse error (CloudKitty's behaviour, `cloudkitty/collector/prometheus_base.py:115-174`)."""
    client = PrometheusClient(PrometheusConnection(prometheus_server.api, retries=0))
    raw = f'max(max_over_time(ratebeam_instance_up{{project_id="{HOSTILE}"}}[3600s])) by (id, project_id)'
    with pytest.raises(PrometheusQueryError):
        client.query(raw, period(0)[1])


# ---- failures ----


def test_server_down_is_retried_then_a_retriable_error():
    port = free_port()
    sleeps: list[float] = []
    client = PrometheusClient(PrometheusConnection(f"http://127.0.0.1:{port}/api/v1", timeout=2, retries=2,
                                                   backoff=0.01), sleep=sleeps.append, jitter=lambda cap: cap)
    with pytest.raises(RetriableConnectorError) as info:
        client.query("up")
    assert client.requests == 3 and sleeps == [0.01, 0.02]  # exponential backoff
    assert "query: up" in str(info.value)


def test_every_scope_in_the_data(prometheus_server):
    up = metric("ratebeam_instance_up", groupby=["id"])
    col = collector(prometheus_server.api)
    seen = {scope: usage(col, scope, *period(0), up)["groupby.id"].to_list() for scope in SCOPES}
    assert seen == {scope: sorted(s.labels["id"] for s in series("ratebeam_instance_up", project_id=scope))
                    for scope in SCOPES}
    with pytest.raises(NoDataCollected):
        col.collect("nobody", *period(0), up)


def test_quote_round_trips_through_the_promql_parser(prometheus_server):
    """Every ASCII character (but ``$``, which label_replace expands) and some non-ASCII text come back
    unchanged from Prometheus' own parser."""
    value = "".join(chr(c) for c in range(1, 128) if chr(c) != "$") + " é ✓ 𝄞 \\n \\x41"
    client = PrometheusClient(PrometheusConnection(prometheus_server.api, retries=0))
    (result,) = client.query(f'label_replace(vector(1), "v", {quote(value)}, "", "")')
    assert result["metric"]["v"] == value
