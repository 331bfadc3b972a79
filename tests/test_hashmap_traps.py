"""The hashmap kernel on the facts most likely to be got wrong (CloudKitty's hashmap, `cloudkitty/rating/hash/__init__.py:159-276`),
the tenant / validity / tie / order rules of `cloudkitty/rating/hash/__init__.py:117-276`, the exact decimal policy, and a randomized
comparison with a plain per-point model of `cloudkitty/rating/hash/__init__.py:159-276` written independently of the kernel."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation, localcontext

import polars as pl
import pytest

from ratebeam.pipelines.interchange import parse_usage
from ratebeam.transforms import hashmap
from ratebeam.transforms.hashmap import rate
from ratebeam.transforms.rules import DEFAULT_GROUP, MappingRule, RuleSet, ThresholdRule

T0 = datetime(2024, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


# --- helpers -------------------------------------------------------------------------------------


def smap(service: str, cost: str, type: str = "flat", group: str | None = None, tenant: str | None = None,
         start: datetime | None = None, end: datetime | None = None) -> MappingRule:
    return MappingRule(service, None, None, type, Decimal(cost), group, tenant, start, end)  # type: ignore[arg-type]


def fmap(service: str, field: str, value: str, cost: str, type: str = "flat", group: str | None = None,
         tenant: str | None = None, start: datetime | None = None, end: datetime | None = None) -> MappingRule:
    return MappingRule(service, field, value, type, Decimal(cost), group, tenant, start, end)  # type: ignore[arg-type]


def thr(service: str, level: str, cost: str, type: str = "flat", field: str | None = None,
        group: str | None = None, tenant: str | None = None) -> ThresholdRule:
    return ThresholdRule(service, field, Decimal(level), type, Decimal(cost), group, tenant)  # type: ignore[arg-type]


def rules(*items: MappingRule | ThresholdRule, fields: tuple[tuple[str, str], ...] | None = None) -> RuleSet:
    """A rule set whose services and fields are declared in order of first use (unless given)."""
    services = tuple(dict.fromkeys(r.service for r in items))
    used = tuple(dict.fromkeys((r.service, r.field) for r in items if r.field is not None))
    return RuleSet(
        services=services,
        fields=used if fields is None else fields,
        mappings=tuple(r for r in items if isinstance(r, MappingRule)),
        thresholds=tuple(r for r in items if isinstance(r, ThresholdRule)),
    )


def pt(type: str, qty: str = "1", scope: str | None = "s1", begin: datetime = T0, end: datetime | None = None,
       price: str | None = None, **labels: str) -> dict:
    """A usage point; labels ``g_<key>`` go to groupby, ``m_<key>`` to metadata."""
    point = {"type": type, "qty": qty, "scope": scope, "begin": begin.isoformat(),
             "end": (end or begin + HOUR).isoformat(),
             "groupby": {k[2:]: v for k, v in labels.items() if k.startswith("g_")},
             "metadata": {k[2:]: v for k, v in labels.items() if k.startswith("m_")}}
    if price is not None:
        point["price"] = price
    return point


def usage(points: list[dict]) -> pl.DataFrame:
    return parse_usage("\n".join(json.dumps(p) for p in points), "test.jsonl")


def prices(rule_set: RuleSet, points: list[dict]) -> list[Decimal | None]:
    """Rated price of each point, None for the points of failed frames."""
    outcome = rate(usage(points), rule_set)
    rated = dict(zip(outcome.rated["i"].to_list(), outcome.rated["price"].to_list(), strict=True))
    return [rated.get(i) for i in range(len(points))]


def price(rule_set: RuleSet, point: dict) -> Decimal | None:
    return prices(rule_set, [point])[0]


def D(text: str) -> Decimal:
    return Decimal(text)


# --- `cloudkitty/rating/hash/__init__.py:159-276` items 1-9 -------------------------------------------------------------------------


def test_1_rate_multiplies_the_group_flat_and_a_rate_only_group_yields_zero() -> None:
    rs = rules(fmap("vm", "flavor", "big", "2", group="g"), fmap("vm", "os", "win", "1.5", "rate", group="g"),
               fmap("vm", "os", "win", "3", "rate", group="only_rate"))
    assert price(rs, pt("vm", "4", g_flavor="big", g_os="win")) == D("12")  # 1.5 * 2 * 4; only_rate adds 0
    assert price(rs, pt("vm", "4", g_os="win")) == 0


def test_2_flats_in_a_group_take_the_maximum_and_negative_flats_never_apply() -> None:
    rs = rules(fmap("vm", "a", "x", "3", group="g"), fmap("vm", "b", "y", "5", group="g"),
               smap("img", "-1"), fmap("vm", "c", "z", "-2", group="g"))
    assert price(rs, pt("vm", "2", g_a="x", g_b="y", g_c="z")) == D("10")  # max(3, 5, -2) * 2
    assert price(rs, pt("vm", "2", g_c="z")) == 0
    assert price(rs, pt("img", "5")) == 0


def test_3_ungrouped_rules_share_the_default_group_and_only_distinct_groups_add() -> None:
    ungrouped = rules(fmap("vm", "flavor", "m1", "1"), fmap("vm", "image", "img", "2"))
    assert price(ungrouped, pt("vm", "2", g_flavor="m1", g_image="img")) == D("4")  # max, not sum
    grouped = rules(fmap("vm", "flavor", "m1", "1", group="A"), fmap("vm", "image", "img", "2", group="B"))
    assert price(grouped, pt("vm", "2", g_flavor="m1", g_image="img")) == D("6")
    named_default = rules(fmap("vm", "flavor", "m1", "1"), fmap("vm", "image", "img", "2", group=DEFAULT_GROUP))
    assert price(named_default, pt("vm", "2", g_flavor="m1", g_image="img")) == D("4")


def test_4_one_threshold_per_group_the_highest_level_reached() -> None:
    rs = rules(smap("vol", "0.01", group="g"), thr("vol", "100", "0.9", "rate", group="g"),
               thr("vol", "1000", "0.8", "rate", group="g"))
    assert [price(rs, pt("vol", q)) for q in ("50", "100", "999.999", "1000", "2000")] == \
        [D("0.5"), D("0.9"), D("8.99999100"), D("8.0"), D("16.0")]


def test_4_a_higher_field_threshold_displaces_the_service_threshold() -> None:
    rs = rules(smap("svc", "2"), thr("svc", "10", "100"),
               thr("svc", "5", "3", "rate", field="n"), thr("svc", "20", "1", field="n"))
    assert price(rs, pt("svc", "12", g_n="6")) == D("124")  # service 10 kept, field 5 < 10
    assert price(rs, pt("svc", "12", g_n="25")) == D("36")  # field 20 displaces: (2 + 1) * 12
    assert price(rs, pt("svc", "3", g_n="25")) == D("9")


def test_5_threshold_effects_by_scope_and_type() -> None:
    service_flat = rules(smap("ip", "0.25"), thr("ip", "0", "1"))
    assert price(service_flat, pt("ip", "3")) == D("1.75")  # 0.25 * 3 + 1, the 1 is not x qty
    service_rate = rules(smap("ip", "0.25"), thr("ip", "0", "2", "rate"))
    assert price(service_rate, pt("ip", "3")) == D("1.5")  # (0.25 * 3) * 2
    field_flat = rules(smap("ip", "0.25"), thr("ip", "0", "1", field="n"))
    assert price(field_flat, pt("ip", "3", g_n="1")) == D("3.75")  # (0.25 + 1) * 3
    field_rate = rules(smap("ip", "0.25"), thr("ip", "0", "2", "rate", field="n"))
    assert price(field_rate, pt("ip", "3", g_n="1")) == D("1.5")  # 0.25 * 2 * 3
    only_threshold = rules(thr("ip", "0", "7"))
    assert price(only_threshold, pt("ip", "3")) == D("7")


def test_6_service_thresholds_compare_qty_and_field_thresholds_the_value() -> None:
    rs = rules(smap("vm", "1"), thr("vm", "8", "0.5", field="vcpus"), thr("vm", "100", "10"))
    assert price(rs, pt("vm", "1", m_vcpus="8")) == D("1.5")  # value 8 reaches 8, qty 1 not 100
    assert price(rs, pt("vm", "100", m_vcpus="1")) == D("110")  # qty 100 reaches 100
    assert price(rs, pt("vm", "1", m_vcpus="1e1")) == D("1.5")  # Decimal('1e1') == 10
    assert price(rs, pt("vm", "1", m_vcpus="Infinity")) == D("1.5")
    assert price(rs, pt("vm", "1")) == D("1")  # key absent: field skipped, no failure


@pytest.mark.parametrize("bad", ["", "eight", "NaN", "sNaN", "8 GB", "1,5"])
def test_6_a_value_decimal_cannot_compare_fails_its_whole_frame_only(bad: str) -> None:
    rs = rules(smap("vm", "1"), smap("other", "2"), thr("vm", "8", "0.5", field="vcpus"))
    points = [pt("other", "1"), pt("vm", "1", m_vcpus=bad), pt("vm", "1", m_vcpus="8"),
              pt("vm", "1", m_vcpus="8", scope="s2"), pt("vm", "1", m_vcpus="8", begin=T0 + HOUR),
              pt("vm", "1", m_vcpus="8", end=T0 + 2 * HOUR)]
    outcome = rate(usage(points), rs)
    assert prices(rs, points) == [None, None, None, D("1.5"), D("1.5"), D("1.5")]
    [failure] = outcome.failures
    assert (failure.scope_id, failure.begin, failure.end) == ("s1", T0, T0 + HOUR)
    assert "'vcpus'" in failure.reason and repr(bad) in failure.reason


def test_6_non_numeric_values_only_fail_where_the_field_has_thresholds() -> None:
    rs = rules(smap("vm", "1"), fmap("vm", "vcpus", "many", "5"), thr("vm", "8", "0.5", field="vcpus", tenant="t1"))
    assert price(rs, pt("vm", "1", scope="s1", g_vcpus="many")) == D("5")  # t1's threshold is not s1's
    assert price(rs, pt("vm", "1", scope="t1", g_vcpus="many")) is None
    assert price(rs, pt("other", "1", scope="t1", g_vcpus="many")) == 0  # no service: untouched


def test_7_tenant_rules_replace_global_rules_per_key_and_add_in_other_groups() -> None:
    rs = rules(fmap("vm", "flavor", "big", "4", group="g"), fmap("vm", "flavor", "big", "3", group="g", tenant="t"),
               fmap("vm", "flavor", "big", "1", group="h", tenant="t"),
               smap("vol", "0.5", group="g"), smap("vol", "0.25", group="g", tenant="t"),
               thr("vol", "10", "2", "rate", group="g"), thr("vol", "10", "3", "rate", group="g", tenant="t"))
    assert price(rs, pt("vm", "1", scope="other", g_flavor="big")) == D("4")
    assert price(rs, pt("vm", "1", scope="t", g_flavor="big")) == D("4")  # 3 (replaces 4) + 1 (group h)
    assert price(rs, pt("vol", "10", scope="other")) == D("10")  # 0.5 * 10 * 2
    assert price(rs, pt("vol", "10", scope="t")) == D("7.5")  # 0.25 * 10 * 3
    assert price(rs, pt("vm", "1", scope=None, g_flavor="big")) == D("4")  # no scope: global only


def test_8_mapping_validity_is_start_inclusive_end_exclusive_at_the_period_begin() -> None:
    start, end = T0 + HOUR, T0 + 3 * HOUR
    rs = rules(smap("vol", "1", group="base"), smap("vol", "10", group="promo", start=start, end=end),
               thr("vol", "0", "100", group="promo"))
    begins = [T0, T0 + HOUR, T0 + 2 * HOUR, T0 + 3 * HOUR]
    got = prices(rs, [pt("vol", "1", begin=b, end=b + 2 * HOUR) for b in begins])
    # the threshold has no validity: it applies to every period
    assert got == [D("101"), D("111"), D("111"), D("101")]


def test_8_validity_ignores_the_period_end_and_the_creation_order() -> None:
    later = T0 + timedelta(minutes=30)
    rs = rules(smap("vol", "2", start=later), smap("vol", "1", end=later))
    assert price(rs, pt("vol", "1", begin=T0, end=T0 + HOUR)) == D("1")  # period overlaps 2's window
    assert price(rs, pt("vol", "1", begin=later, end=later + HOUR)) == D("2")


def test_9_matching_is_exact_string_equality_over_metadata_overlaid_by_groupby() -> None:
    rs = rules(fmap("vm", "az", "az1", "5", group="G"), fmap("vm", "az", "az1", "7", group="H"),
               fmap("vm", "flavor", "M1", "1"), fmap("vm", "tier", "", "3", group="E"))
    assert price(rs, pt("vm", "1", g_az="az1", m_az="az9")) == D("12")  # groupby wins
    assert price(rs, pt("vm", "1", g_az="az9", m_az="az1")) == 0
    assert price(rs, pt("vm", "1", m_az="az1")) == D("12")  # metadata when groupby lacks the key
    assert price(rs, pt("vm", "1", g_flavor="m1")) == 0  # case-sensitive
    assert price(rs, pt("vm", "1", g_flavor="M1 ")) == 0
    assert price(rs, pt("vm", "1", g_tier="")) == D("3")  # a present empty label is looked up


def test_9_json_numbers_and_booleans_in_labels_match_their_python_str() -> None:
    rs = rules(fmap("vm", "size", "1.5", "2", group="a"), fmap("vm", "gpu", "True", "3", group="b"),
               fmap("vm", "n", "10", "4", group="c"))
    point = {"type": "vm", "qty": "1", "begin": T0.isoformat(), "end": (T0 + HOUR).isoformat(),
             "groupby": {"size": 1.50, "gpu": True, "n": 10}, "metadata": {}}
    assert price(rs, point) == D("9")


def test_9_json_numbers_and_booleans_compare_with_thresholds_as_decimal_of_the_value() -> None:
    rs = rules(smap("vm", "1"), thr("vm", "0.3", "10", field="ratio"), thr("vm", "1", "100", field="gpu"),
               thr("vm", "0", "1000", field="off"))

    def point(**groupby: object) -> dict:
        return {"type": "vm", "qty": "1", "begin": T0.isoformat(), "end": (T0 + HOUR).isoformat(),
                "groupby": groupby, "metadata": {}}

    # Decimal(0.3) is 0.29999999999999998889...: below the level 0.3, unlike the text "0.3"
    assert price(rs, point(ratio=0.3)) == D("1")
    assert price(rs, point(ratio="0.3")) == D("11")
    assert price(rs, point(gpu=True)) == D("101")  # Decimal(True) == 1, where Decimal("True") fails
    assert price(rs, point(off=False)) == D("1001")
    assert price(rs, point(gpu="True")) is None


# --- ties, order, prices in and out -------------------------------------------------------------


def test_ties_keep_the_service_threshold_then_the_earlier_field() -> None:
    rs = rules(smap("s", "1"), thr("s", "5", "100"), thr("s", "5", "2", "rate", field="a"))
    assert price(rs, pt("s", "6", g_a="5")) == D("106")  # service offered first, same level
    two_fields = (thr("s", "5", "10", field="b"), thr("s", "5", "20", field="a"), smap("s", "1"))
    b_first = rules(*two_fields, fields=(("s", "b"), ("s", "a")))
    a_first = rules(*two_fields, fields=(("s", "a"), ("s", "b")))
    assert price(b_first, pt("s", "2", g_a="5", g_b="5")) == D("22")  # (1 + 10) * 2
    assert price(a_first, pt("s", "2", g_a="5", g_b="5")) == D("42")  # (1 + 20) * 2


def test_thresholds_at_or_below_minus_one_are_never_selected() -> None:
    rs = rules(smap("s", "1"), thr("s", "-1", "100"), thr("s", "-0.5", "7", field="f"))
    assert price(rs, pt("s", "-3")) == D("-3")
    assert price(rs, pt("s", "2", g_f="-0.5")) == D("16")  # (1 + 7) * 2


def test_hashmap_adds_to_the_input_price_and_leaves_unknown_types_alone() -> None:
    rs = rules(smap("vm", "2"))
    got = prices(rs, [pt("vm", "3", price="0.5"), pt("net", "3", price="0.25"), pt("vm", "0", price="-1")])
    assert got == [D("6.5"), D("0.25"), D("-1")]


def test_rows_keep_their_order_and_extra_columns() -> None:
    rs = rules(smap("vm", "2"), thr("vm", "1", "1", field="f"))
    frame = usage([pt("vm", str(n), scope=f"s{n % 3}", g_f=str(n)) for n in range(30)])
    frame = frame.with_columns(pl.col("i").alias("extra")).reverse()
    outcome = rate(frame, rs)
    assert outcome.rated.columns == frame.columns
    assert outcome.rated["extra"].to_list() == frame["extra"].to_list()
    assert outcome.rated["price"].to_list() == [Decimal((2 + 1) * n) for n in range(29, -1, -1)]  # (flat + field thr) * qty


# --- exactness ----------------------------------------------------------------------------------


def _exact(formula: Callable[..., Decimal], **values: str) -> Decimal:
    """``formula`` over Decimals with 200 digits (nothing rounds), then rounded half-even at 1e-20."""
    with localcontext() as ctx:
        ctx.prec = 200
        result = formula(**{k: Decimal(v) for k, v in values.items()})
        return result.quantize(Decimal("1E-20"), rounding=ROUND_HALF_EVEN)


def test_prices_are_exact_then_rounded_half_even_once_at_20_decimals() -> None:
    cost, rate_, tiny = "0.1234567890123456789012345678", "1.0000000000000000000000000003", "5E-28"
    rs = rules(smap("s", cost, group="a"), fmap("s", "f", "x", rate_, "rate", group="a"), smap("s", tiny, group="b"))
    qty = "12345.678901234567890123"[:-5]  # 18 decimals
    assert price(rs, pt("s", qty, g_f="x")) == _exact(lambda c, r, t, q: (c * r + t) * q, c=cost, r=rate_, t=tiny, q=qty)


def test_simple_costs_keep_every_decimal_of_qty_times_cost() -> None:
    rs = rules(smap("s", "0.000001"), thr("s", "0", "0.3", "rate"))
    qty = "0.123456789012345678"
    assert price(rs, pt("s", qty)) == _exact(lambda c, q, r: c * q * r, c="0.000001", q=qty, r="0.3")
    # exact: 0.0000000370370367037037034, 25 decimals, rounded at 20
    assert price(rs, pt("s", qty)) == Decimal("0.00000003703703670370")


def test_a_huge_coefficient_with_a_tiny_quantity_stays_exact() -> None:
    rs = rules(smap("s", "100000000000.5"), fmap("s", "f", "x", "999999999999", "rate"))
    got = prices(rs, [pt("s", "0.000000001", g_f="x"), pt("s", "0.000000000000000003", g_f="x")])
    assert got == [_exact(lambda c, r, q: c * r * q, c="100000000000.5", r="999999999999", q=q)
                   for q in ("0.000000001", "0.000000000000000003")]


def test_a_price_that_does_not_fit_fails_its_frame() -> None:
    rs = rules(smap("s", "999999999999"))
    outcome = rate(usage([pt("s", "99999999999999999999"), pt("s", "1", scope="s2")]), rs)
    assert outcome.rated["i"].to_list() == [1]
    [failure] = outcome.failures
    assert "does not fit" in failure.reason


def test_keys_of_many_fields_span_several_packed_words() -> None:
    fields = [f"f{n}" for n in range(24)]
    items = [fmap("vm", f, str(v), str(v + n), group=f"g{n % 3}") for n, f in enumerate(fields) for v in range(9)]
    items += [thr("vm", str(level), "0.5", "rate", field=f, group="g0") for f in fields[:3] for level in (2, 5)]
    rs = rules(*items)
    assert len(hashmap._layout(hashmap.compile_rules(rs)).words) > 1
    rng = random.Random(7)
    points = [pt("vm", str(rng.randint(1, 9)), **{f"g_{f}": str(rng.randint(0, 11)) for f in fields if rng.random() < 0.7})
              for _ in range(40)]
    assert prices(rs, points) == [_model_price(rs, p) for p in points]


def test_service_levels_beyond_the_qty_range_are_handled() -> None:
    # -1e25 is below -1 (never selected), 1e25 above any qty (never reached)
    rs = RuleSet(services=("s",), mappings=(smap("s", "1"),),
                 thresholds=(thr("s", "-1E+25", "2", "rate"), thr("s", "1", "3", "rate"),
                             thr("s", "1E+25", "5", "rate")))
    assert prices(rs, [pt("s", "0.5"), pt("s", "4", scope="s2"), pt("s", "12345678901234567", scope="s3")]) == \
        [D("0.5"), D("12"), D("37037036703703701")]


def test_batching_does_not_change_any_price() -> None:
    rs = rules(fmap("vm", "f", "a", "1.5", group="x"), fmap("vm", "f", "a", "2", group="x", tenant="s1"),
               thr("vm", "2", "0.5", field="n", group="x"), smap("vol", "0.01"), thr("vol", "10", "0.9", "rate"))
    points = [pt("vm", str(q), scope=s, g_f="a", g_n=str(q)) for q in range(5) for s in ("s1", "s2")]
    points += [pt("vol", str(q * 7), scope="s1") for q in range(5)]
    together = prices(rs, points)
    alone = [price(rs, p) for p in points]
    assert together == alone


# --- randomized comparison with a per-point model of `cloudkitty/rating/hash/__init__.py:159-276` ---------------------------------


def _model_tables(rs: RuleSet, service: str, scope: str | None, begin: datetime) -> tuple:
    """CloudKitty's in-memory tables for one service (`cloudkitty/rating/hash/__init__.py:117-157`), built rule by rule."""
    svc_maps: dict = {}
    svc_thr: dict = {}
    f_maps: dict = {}
    f_thr: dict = {}
    owners = [None] if scope is None else [None, scope]
    for owner in owners:
        for m in rs.mappings:
            if m.service != service or m.tenant_id != owner:
                continue
            if (m.start is not None and m.start > begin) or (m.end is not None and m.end <= begin):
                continue
            g = m.group or DEFAULT_GROUP
            if m.field is None:
                svc_maps[g] = (m.type, m.cost)
            else:
                f_maps.setdefault(m.field, {}).setdefault(g, {})[m.value] = (m.type, m.cost)
        for t in rs.thresholds:
            if t.service != service or t.tenant_id != owner:
                continue
            g = t.group or DEFAULT_GROUP
            target = svc_thr if t.field is None else f_thr.setdefault(t.field, {})
            target.setdefault(g, {})[t.level] = (t.type, t.cost)
    return svc_maps, svc_thr, f_maps, f_thr


def _model_price(rs: RuleSet, point: dict) -> Decimal:
    """One point through `cloudkitty/rating/hash/__init__.py:159-276`, literally; raises like CloudKitty on a bad field value."""
    kind, q, p = point["type"], Decimal(point["qty"]), Decimal(point.get("price", "0"))
    if kind not in rs.services:
        return p
    begin = datetime.fromisoformat(point["begin"])
    svc_maps, svc_thr, f_maps, f_thr = _model_tables(rs, kind, point["scope"], begin)
    acc: dict = {}

    def group(g: str) -> dict:
        return acc.setdefault(g, {"flat": Decimal(0), "rate": Decimal(1),
                                  "thr": (Decimal(-1), "flat", Decimal(0), "field")})

    def apply(g: str, mtype: str, cost: Decimal) -> None:
        a = group(g)
        if mtype == "rate":
            a["rate"] *= cost
        elif cost > a["flat"]:
            a["flat"] = cost

    def offer(g: str, level: Decimal, mtype: str, cost: Decimal, scope: str) -> None:
        a = group(g)
        if level > a["thr"][0]:
            a["thr"] = (level, mtype, cost, scope)

    with localcontext() as ctx:
        ctx.prec = 300
        for g, (mtype, cost) in svc_maps.items():
            apply(g, mtype, cost)
        for g, levels in svc_thr.items():
            for level, (mtype, cost) in levels.items():
                if q >= level:
                    offer(g, level, mtype, cost, "service")
        desc = {**point["metadata"], **point["groupby"]}
        for service, field in rs.fields:
            if service != kind or field not in desc:
                continue
            value = desc[field]
            for g, values in f_maps.get(field, {}).items():
                if value in values:
                    apply(g, *values[value])
            if f_thr.get(field):
                with localcontext() as strict:
                    strict.traps[InvalidOperation] = True
                    number = Decimal(value)
                    for g, levels in f_thr[field].items():
                        for level, (mtype, cost) in levels.items():
                            if number >= level:
                                offer(g, level, mtype, cost, "field")
        total = p
        for a in acc.values():
            flat, rate_, (_, ttype, tcost, tscope) = a["flat"], a["rate"], a["thr"]
            if tscope == "field":
                if ttype == "flat":
                    flat += tcost
                else:
                    rate_ *= tcost
            res = rate_ * flat * q
            if tscope == "service":
                res = res + tcost if ttype == "flat" else res * tcost
            total += res
        return total.quantize(Decimal("1E-20"), rounding=ROUND_HALF_EVEN)


def _random_case(rng: random.Random) -> tuple[RuleSet, list[dict]]:
    costs = ["0", "1", "2.5", "0.01", "-1", "3", "0.9", "1.1", "0.0000000000000000000000000007",
             "12.3456789012345678901234567891"]
    levels = ["-2", "-1", "-0.5", "0", "1", "5", "8", "10", "8.00000000", "100"]
    values = ["a", "b", "", "1", "8", "10", "1e1", "NaN", "x y", "+4", "-0", " 8"]
    groups = [None, None, "g1", "g2"]
    tenants = [None, None, "t1", "t2"]
    times = [None, T0, T0 + HOUR, T0 + 2 * HOUR]
    services = ["s1", "s2", "s3"]
    field_names = ["f1", "f2", "f3"]
    items: list = []
    for _ in range(rng.randint(4, 24)):
        service = rng.choice(services)
        field = rng.choice([None, *field_names])
        if rng.random() < 0.6:
            start, end = rng.choice(times), rng.choice(times)
            if start is not None and end is not None and end <= start:
                end = None
            items.append(MappingRule(service, field, None if field is None else rng.choice(values),
                                     rng.choice(["flat", "rate"]), Decimal(rng.choice(costs)),
                                     rng.choice(groups), rng.choice(tenants), start, end))
        else:
            items.append(ThresholdRule(service, field, Decimal(rng.choice(levels)), rng.choice(["flat", "rate"]),
                                       Decimal(rng.choice(costs)), rng.choice(groups), rng.choice(tenants)))
    order = [(s, f) for s in services for f in field_names]
    rng.shuffle(order)
    rs = RuleSet(services=tuple(services[:rng.randint(2, 3)]), fields=tuple(order),
                 mappings=tuple(i for i in items if isinstance(i, MappingRule)),
                 thresholds=tuple(i for i in items if isinstance(i, ThresholdRule)))
    points = []
    for _ in range(rng.randint(1, 60)):
        begin = T0 + HOUR * rng.randint(0, 3)
        labels = {}
        for f in field_names:
            where = rng.random()
            if where < 0.5:
                labels[("g_" if where < 0.3 else "m_") + f] = rng.choice(values if rng.random() < 0.4 else values[:7])
        points.append(pt(rng.choice([*services, "s4"]), rng.choice(["0", "1", "4.5", "10", "100", "250.75"]),
                         scope=rng.choice(["t1", "t2", "u", None]), begin=begin,
                         price=rng.choice([None, "0", "0.5"]), **labels))
    return rs, points


@pytest.mark.parametrize("seed", range(60))
def test_random_rule_sets_agree_with_the_per_point_model(seed: int) -> None:
    rng = random.Random(seed)
    rs, points = _random_case(rng)
    frames: dict = {}
    for n, p in enumerate(points):
        frames.setdefault((p["scope"], p["begin"], p["end"]), []).append(n)
    expected: list[Decimal | None] = [None] * len(points)
    for members in frames.values():
        try:
            priced = [_model_price(rs, points[n]) for n in members]
        except (InvalidOperation, TypeError):
            continue
        for n, value in zip(members, priced, strict=True):
            expected[n] = value
    assert prices(rs, points) == expected


# --- exact quantities --------------------------------------------------------


def _exact_split(exact: Decimal) -> tuple[Decimal, Decimal | None]:
    from ratebeam.transforms.schema import qty_remainder, quantize_qty

    with localcontext() as ctx:
        ctx.prec = 100
        qty = quantize_qty(exact)
        return qty, qty_remainder(exact, qty)


@pytest.mark.parametrize("seed", range(3))
def test_a_quantity_with_a_remainder_is_priced_exactly_and_rounded_once(seed) -> None:
    """price = round20(cost * (qty + remainder)), ties to even: random costs and quantities of up to
    38 decimals, a service threshold reached by the exact quantity only, and exact ties."""
    from ratebeam.transforms.schema import QTY_REMAINDER, QTY_REMAINDER_POLARS

    rng = random.Random(seed)
    cost = Decimal(rng.randrange(1, 10**9)).scaleb(-8)
    rule_set = rules(smap("s", str(cost), group="g"), thr("s", "1000", "0.5", "rate", group="g"))
    exacts = [Decimal(rng.randrange(10**33)).scaleb(-rng.randrange(19, 39)) for _ in range(300)]
    exacts += [Decimal(1000) - Decimal(1).scaleb(-30), Decimal(1000) + Decimal(1).scaleb(-30)]  # around a level
    ties = rules(smap("t", "0.5", group="g"))  # ties of the remainder alone: (2m + 1) * 0.5e-20
    tie_exacts = [Decimal(k).scaleb(-20) + Decimal(2 * m + 1).scaleb(-20) for k in (0, 1, 2, 3) for m in (0, 1, 2)]
    # ties after an odd or even rounded price: 0.05 * (n e-18 +- 1e-19) = (5n +- 0.5) e-20
    odd_ties = rules(smap("u", "0.05", group="g"))
    odd_exacts = [Decimal(n).scaleb(-18) + Decimal(s).scaleb(-19) for n in (1, 2, 3, 4, 7) for s in (1, -1)]
    for rule_set_, service, values, price_of in (
        (rule_set, "s", exacts, lambda q: cost * q * (Decimal("0.5") if q >= 1000 else 1)),
        (ties, "t", tie_exacts, lambda q: Decimal("0.5") * q),
        (odd_ties, "u", odd_exacts, lambda q: Decimal("0.05") * q),
    ):
        split = [_exact_split(q) for q in values]
        frame = usage([pt(service, str(qty)) for qty, _ in split]).with_columns(
            pl.Series(QTY_REMAINDER, [r for _, r in split], dtype=QTY_REMAINDER_POLARS))
        rated = rate(frame, rule_set_).rated["price"].to_list()
        with localcontext() as ctx:
            ctx.prec = 200
            expected = [price_of(q).quantize(Decimal("1e-20"), rounding=ROUND_HALF_EVEN) for q in values]
        assert rated == expected
