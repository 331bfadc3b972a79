"""Seeded random (rules JSON, usage JSONL) cases for the differential test against CloudKitty.

Each case is a small, realistic hashmap rule set plus a few hundred usage points built to walk into
every known trap of CloudKitty's hashmap (`cloudkitty/rating/hash/__init__.py:159-276`): rate-only groups, max of flats (negative flats
included), rules sharing the implicit ``_DEFAULT_`` group, one threshold per group competing across
the service and its fields (ties, displacement), service vs field threshold effects, numeric-looking
and non-numeric field values (``''`` included: failing frames), tenant rules overriding global ones
per key or adding in other groups, ``[start, end)`` validity windows around the period begins,
groupby overriding metadata, ``str()`` matching of numeric strings.  :func:`traps_covered` says
which of them a case contains, so the test can prove a run covered them all.

Rule sets respect CloudKitty's own validations (`cloudkitty/rating/hash/db/sqlalchemy/api.py:311-405`) — they are loaded through CloudKitty's
DB API, which refuses the others: per (parent, value, tenant, group) the validity windows are
disjoint, created oldest first, and two closed windows never touch (CloudKitty's overlap check
counts ``end == start`` as overlapping); one threshold level per (parent, tenant).

Decimals are exact on both sides by construction: costs carry up to 10 decimals, levels up to 8
(NUMERIC(20,8)), quantities up to 9; :func:`_fit_exactness` lowers the scales of a (service, group)
whose worst-case price could need more than 20 decimals (ratebeam's price scale) or more than
26 significant digits (CloudKitty computes with 28).  Fields are written in name order because
CloudKitty's field query comes back in name order on SQLite (the (service_id, name) unique index),
and that order breaks threshold ties across fields.

Run as a script to write cases to a folder: ``python generate.py --seed 7 --cases 3 --out /tmp/c``.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

DEFAULT_GROUP = "_DEFAULT_"
HOUR = timedelta(hours=1)

SERVICE_POOL = ("instance", "volume.size", "ip.floating", "image.size", "snapshot.size", "cpu.hours",
                "storage.objects")
UNRATED_TYPES = ("network.bw", "other.metric")
GROUP_POOL = ("instance_uptime", "license", "volume", "G", "H", "support", "g.with.dots")
TENANT_POOL = ("p-0001", "p-0002", "t-special", "tenant-x", "7f3c9a")
NUMERIC_FIELDS = ("vcpus", "ram", "disk_gb", "n", "cores")
CATEGORY_FIELDS = ("flavor_name", "os_distro", "volume_type", "az", "image", "tier", "project_id",
                   "instance.flavor")
CATEGORIES = ("m1.tiny", "m1.small", "m1.large", "m1.xlarge", "M1.LARGE", "m1.large ", "windows",
              "Windows", "linux", "rhel", "ubuntu", "ssd", "hdd", "nvme", "az1", "az2", "True", "None",
              "1.5", "gold", "silver")
#: Numeric strings, several spellings of one number: mappings match on str(), thresholds on Decimal().
NUMBERS = ("0", "1", "2", "3", "4", "8", "16", "32", "100", "0.5", "1.5", "8.0", "08", "1e1", "1E1", "+4",
           "-1", "-0", "4.00", ".5", "5.", "2e0", "0.25", "12", "25", "6", "0.1", "0.3", "1.1", "2.675")
#: Strings Python's Decimal() accepts although they hardly look numeric.
ODD_NUMBERS = (" 8", "8 ", "1_0", "Infinity", "-Infinity", "inf", "\uff18")
#: Values on which Decimal() raises, or whose comparison raises (NaN): the frame fails.
NOT_NUMBERS = ("", "", "abc", "NaN", "sNaN", "1,5", "0x10", "1/2", "8 GB", "--1", "e1", "None")


@dataclass
class Case:
    """One differential case: a rules document and the usage points to rate with it."""

    name: str
    rules: dict[str, Any]
    usage: list[dict[str, Any]]

    def write(self, directory: Path) -> tuple[Path, Path]:
        """Write ``<name>.rules.json`` and ``<name>.usage.jsonl``; return their paths."""
        directory.mkdir(parents=True, exist_ok=True)
        rules = directory / f"{self.name}.rules.json"
        usage = directory / f"{self.name}.usage.jsonl"
        rules.write_text(json.dumps(self.rules, indent=1) + "\n")
        usage.write_text("".join(json.dumps(p) + "\n" for p in self.usage))
        return rules, usage


def scale(value: Decimal) -> int:
    """Decimals needed to write ``value`` exactly (trailing zeros don't count)."""
    if not value:
        return 0
    return max(0, -value.normalize().as_tuple().exponent)


def _digits(value: Decimal) -> int:
    return len(str(int(abs(value)))) if abs(value) >= 1 else 1


@dataclass
class _Field:
    name: str
    numeric: bool
    pool: list[str]
    rule: dict[str, Any]


@dataclass
class _Service:
    name: str
    qty_scale: int
    qty_max: Decimal
    rule: dict[str, Any]
    fields: list[_Field]


class _Builder:
    """Draws one case from ``rng``; the methods are the steps, in the order they run."""

    def __init__(self, rng: random.Random, points: int) -> None:
        self.rng = rng
        self.n_points = points
        base = datetime(2024, 1, 1, tzinfo=UTC) + timedelta(days=rng.randint(0, 365))
        self.begins = sorted(base + h * HOUR for h in rng.sample(range(72), rng.randint(2, 5)))
        self.tenants = rng.sample(TENANT_POOL, rng.randint(1, 3))
        self.scopes: list[str | None] = [*self.tenants, None] if rng.random() < 0.6 else list(self.tenants)
        groups = rng.sample(GROUP_POOL, rng.randint(1, 4))
        if rng.random() < 0.1:
            groups.append(DEFAULT_GROUP)  # named explicitly: the same group as the ungrouped rules
        self.groups = groups
        self.ungrouped = rng.choice((0.2, 0.35, 0.6))
        self.bad_rate = 0.0 if rng.random() < 0.6 else rng.choice((0.004, 0.01, 0.03))
        self.odd_rate = 0.0 if rng.random() < 0.5 else 0.02
        self.json_rate = 0.0 if rng.random() < 0.6 else 0.06
        self.keys: set[tuple[Any, ...]] = set()
        instants = set()
        for b in self.begins:
            instants |= {b, b + timedelta(seconds=1), b - timedelta(seconds=1), b + HOUR / 2}
            if rng.random() < 0.3:
                instants |= {b + timedelta(microseconds=1), b - timedelta(microseconds=1)}
        instants |= {self.begins[0] - timedelta(days=30), self.begins[-1] + timedelta(days=30)}
        self.instants = sorted(instants)

    # --- decimals ------------------------------------------------------------------------------

    def decimal(self, maximum: Decimal, places: int, minimum: Decimal = Decimal(0)) -> Decimal:
        unit = Decimal(1).scaleb(-places)
        low, high = int(minimum / unit), int(maximum / unit)
        return Decimal(self.rng.randint(low, max(low, high))) * unit

    def cost_scale(self) -> int:
        return self.rng.choices((0, 1, 2, 3, 4, 6, 8, 10), weights=(3, 3, 4, 3, 2, 1, 1, 1))[0]

    def flat_cost(self) -> Decimal:
        r = self.rng.random()
        if r < 0.05:
            return Decimal(0)
        top = Decimal(self.rng.choice(("0.01", "0.1", "1", "5", "10", "100")))
        value = self.decimal(top, self.cost_scale(), minimum=Decimal(1).scaleb(-10)) or Decimal("0.5")
        return -value if r < 0.15 else value

    def rate_cost(self) -> Decimal:
        r = self.rng.random()
        if r < 0.03:
            return Decimal(0)
        if r < 0.05:
            return -Decimal(self.rng.choice(("0.5", "1", "2")))
        if r < 0.6:
            return Decimal(self.rng.choice(("0.5", "0.9", "1.1", "1.2", "2", "3", "0.75", "1.05", "0.85")))
        return self.decimal(Decimal(3), self.rng.choice((0, 1, 2, 3, 4)), minimum=Decimal("0.01"))

    def cost(self, kind: str) -> Decimal:
        return self.flat_cost() if kind == "flat" else self.rate_cost()

    def kind(self, p_rate: float) -> str:
        return "rate" if self.rng.random() < p_rate else "flat"

    def group(self) -> str | None:
        return None if self.rng.random() < self.ungrouped else self.rng.choice(self.groups)

    # --- validity windows ------------------------------------------------------------------------

    def instant(self, value: datetime) -> str:
        """ISO-8601 in one of the spellings the format allows (Z, offset, naive = UTC)."""
        r = self.rng.random()
        if r < 0.5:
            return value.isoformat().replace("+00:00", "Z")
        if r < 0.7:
            return value.isoformat()
        if r < 0.85:
            return value.replace(tzinfo=None).isoformat()
        return value.astimezone(timezone(timedelta(hours=self.rng.choice((2, -5, 5.5))))).isoformat()

    def windows(self) -> list[tuple[datetime | None, datetime | None]]:
        r = self.rng.random()
        pick = self.instants
        if r < 0.5:
            return [(None, None)]
        if r < 0.65:
            return [(self.rng.choice(pick), None)]
        if r < 0.8:
            i = self.rng.randrange(1, len(pick))
            start = None if self.rng.random() < 0.5 else pick[self.rng.randrange(i)]
            return [(start, pick[i])]
        a, b, c, d = sorted(self.rng.sample(range(len(pick)), 4))  # >= 10 instants
        first = (None if self.rng.random() < 0.3 else pick[a], pick[b])
        if self.rng.random() < 0.5:
            return [first, (pick[b], None)]  # adjacent: [a, b) then [b, open)
        return [first, (pick[c], pick[d] if self.rng.random() < 0.5 else None)]

    # --- rules -----------------------------------------------------------------------------------

    def mapping(self, kind: str, group: str | None, tenant: str | None, value: str | None,
                window: tuple[datetime | None, datetime | None]) -> dict[str, Any]:
        rule: dict[str, Any] = {}
        if value is not None:
            rule["value"] = value
        if kind != "flat" or self.rng.random() < 0.7:
            rule["type"] = kind
        rule["cost"] = self.cost(kind)
        if group is not None or self.rng.random() < 0.3:
            rule["group"] = group
        if tenant is not None or self.rng.random() < 0.2:
            rule["tenant_id"] = tenant
        start, end = window
        if start is not None:
            rule["start"] = self.instant(start)
        elif self.rng.random() < 0.2:
            rule["start"] = None
        if end is not None or self.rng.random() < 0.2:
            rule["end"] = None if end is None else self.instant(end)
        return rule

    def mapping_family(self, out: list[dict[str, Any]], parent: str, value: str | None,
                       p_rate: float) -> None:
        """A global mapping key (its windows), maybe a tenant override, maybe a tenant rule elsewhere."""
        group = self.group()
        kind = self.kind(p_rate)
        plans = [(group, None)]
        if self.rng.random() < 0.3:
            plans.append((group, self.rng.choice(self.tenants)))  # overrides the global rule's key
        if self.rng.random() < 0.12:
            other = self.rng.choice([g for g in [*self.groups, None] if g != group])
            plans.append((other, self.rng.choice(self.tenants)))  # adds in another group
        if self.rng.random() < 0.05:
            plans = plans[1:] or plans  # a tenant-only rule
        for grp, tenant in plans:
            key = (parent, value, tenant, DEFAULT_GROUP if grp is None else grp)
            if key in self.keys:
                continue
            self.keys.add(key)
            for window in self.windows():
                rule_kind = kind if tenant is None or self.rng.random() < 0.7 else self.kind(p_rate)
                out.append(self.mapping(rule_kind, grp, tenant, value, window))

    def thresholds(self, out: list[dict[str, Any]], levels: list[Decimal], p_tenant: float,
                   tenant_only: bool = False) -> None:
        """Thresholds at distinct levels per tenant; tenants may reuse a global level (override)."""
        owners: list[str | None] = [] if tenant_only else [None]
        if tenant_only or self.rng.random() < p_tenant:
            owners.append(self.rng.choice(self.tenants))
        for tenant in owners:
            count = self.rng.randint(1, min(4, len(levels)))
            for level in self.rng.sample(levels, count):
                kind = self.kind(0.5)
                rule: dict[str, Any] = {"level": level, "type": kind, "cost": self.cost(kind)}
                group = self.group()
                if group is not None or self.rng.random() < 0.3:
                    rule["group"] = group
                if tenant is not None:
                    rule["tenant_id"] = tenant
                out.append(rule)

    def field(self, service: str, name: str) -> _Field:
        numeric = name in NUMERIC_FIELDS
        if name == "project_id":
            pool = [*self.tenants, "p-9999"]
        elif numeric:
            pool = self.rng.sample(NUMBERS, self.rng.randint(5, 9))
        else:
            pool = self.rng.sample(CATEGORIES, self.rng.randint(3, 6))
        rule: dict[str, Any] = {"name": name}
        mappings: list[dict[str, Any]] = []
        for value in self.rng.sample(pool, self.rng.randint(0, len(pool) - 1)):
            self.mapping_family(mappings, f"{service}/{name}", value, p_rate=0.35)
            if self.rng.random() < 0.1:
                self.mapping_family(mappings, f"{service}/{name}", value, p_rate=0.35)  # same value, 2nd group
        if mappings:
            rule["mappings"] = mappings
        if numeric and self.rng.random() < 0.6:
            levels = {Decimal(v) + 0 for v in pool}  # + 0: no "-0" level
            levels.add(Decimal(self.rng.choice(("0", "-1", "-0.5", "5", "10", "20"))))
            thresholds: list[dict[str, Any]] = []
            self.thresholds(thresholds, sorted(levels), p_tenant=0.3, tenant_only=self.rng.random() < 0.1)
            rule["thresholds"] = thresholds
        return _Field(name, numeric, pool, rule)

    def service(self, name: str) -> _Service:
        qty_scale = self.rng.choice((0, 0, 0, 1, 2, 3, 6, 9))
        qty_max = Decimal(self.rng.choice(("1", "10", "100", "1000", "10000")))
        rule: dict[str, Any] = {"name": name}
        mappings: list[dict[str, Any]] = []
        if self.rng.random() < 0.7:
            for _ in range(self.rng.choice((1, 1, 2, 3))):
                self.mapping_family(mappings, name, None, p_rate=0.3)
        if mappings:
            rule["mappings"] = mappings
        if self.rng.random() < 0.5:
            levels = {Decimal(0), Decimal(-1), qty_max / 2, qty_max / 10, qty_max, Decimal("-0.5")}
            levels |= {self.decimal(qty_max, min(qty_scale, 8)) for _ in range(3)}
            thresholds: list[dict[str, Any]] = []
            self.thresholds(thresholds, sorted(levels), p_tenant=0.3)
            rule["thresholds"] = thresholds
        names = self.rng.sample((*NUMERIC_FIELDS, *CATEGORY_FIELDS), self.rng.choice((0, 1, 2, 2, 3, 3, 4)))
        fields = [self.field(name, f) for f in sorted(names)]
        if fields:
            rule["fields"] = [f.rule for f in fields]
        return _Service(name, qty_scale, qty_max, rule, fields)

    # --- exactness -------------------------------------------------------------------------------

    def fit_exactness(self, svc: _Service) -> None:
        """Lower cost scales until every group's worst-case price is exact on both sides."""
        parents = [svc.rule] + [f.rule for f in svc.fields]
        while True:
            worst = None
            for group in self.service_groups(parents):
                places, size, members = _group_bound(parents, group, svc)
                if places > 20 or places + size > 26 or size > 14:
                    worst = (places, size, members)
                    break
            if worst is None:
                return
            places, size, members = worst
            if size > 14:
                rule = max(members, key=lambda r: abs(r["cost"]))
                if abs(rule["cost"]) > 3:
                    rule["cost"] = (1 if rule["cost"] > 0 else -1) * self.decimal(Decimal(3), scale(rule["cost"]),
                                                                                  Decimal(1))
                    continue
                svc.qty_max = max(Decimal(1), svc.qty_max / 10)
                continue
            rule = max(members, key=lambda r: scale(r["cost"]))
            places_now = scale(rule["cost"])
            if places_now == 0:
                svc.qty_scale = max(0, svc.qty_scale - 3)
                continue
            rounded = rule["cost"].quantize(Decimal(1).scaleb(-max(0, places_now - 3)))
            rule["cost"] = rounded or Decimal(1).scaleb(-max(0, places_now - 3)).copy_sign(rule["cost"])

    @staticmethod
    def service_groups(parents: list[dict[str, Any]]) -> set[str]:
        return {r.get("group") or DEFAULT_GROUP for p in parents
                for r in (*p.get("mappings", ()), *p.get("thresholds", ()))}

    # --- usage -----------------------------------------------------------------------------------

    def qty(self, svc: _Service) -> Any:
        r = self.rng.random()
        levels = [t["level"] for t in svc.rule.get("thresholds", ()) if t["level"] >= 0
                  and scale(t["level"]) <= svc.qty_scale]
        if r < 0.15 and levels:
            value = self.rng.choice(levels)
        elif r < 0.2:
            value = Decimal(0)
        elif r < 0.22:
            value = -self.decimal(svc.qty_max / 10, svc.qty_scale)  # a credit: below every level
        else:
            value = self.decimal(svc.qty_max, svc.qty_scale)
        r = self.rng.random()
        if r < 0.05 and value == value.to_integral_value():
            return int(value)
        if r < 0.08 and scale(value) <= 3:
            return float(value)
        text = format(value, "f")
        if r < 0.13:
            text += "0" if "." in text else ".00"
        return text

    def label(self, fld: _Field, has_thresholds: bool) -> str:
        if fld.numeric and has_thresholds and self.bad_rate and self.rng.random() < self.bad_rate:
            return self.rng.choice(NOT_NUMBERS)
        if fld.numeric and self.odd_rate and self.rng.random() < self.odd_rate:
            return self.rng.choice(ODD_NUMBERS)
        values = [m["value"] for m in fld.rule.get("mappings", ())]
        if values and self.rng.random() < 0.5:
            return self.rng.choice(values)
        return self.rng.choice(fld.pool)

    def point(self, services: list[_Service]) -> dict[str, Any]:
        rng = self.rng
        scope = rng.choice(self.scopes)
        begin = rng.choice(self.begins)
        end = begin + (HOUR if rng.random() < 0.95 else HOUR / 2)
        svc = rng.choice(services) if rng.random() < 0.93 else None
        groupby: dict[str, str] = {"id": f"r-{rng.randint(1, 40)}"}
        metadata: dict[str, str] = {}
        point: dict[str, Any] = {"type": svc.name if svc else rng.choice(UNRATED_TYPES)}
        point["qty"] = self.qty(svc) if svc else str(self.decimal(Decimal(100), 2))
        if rng.random() < 0.5:
            point["unit"] = rng.choice(("instance", "GiB", "", "hour"))
        if rng.random() < 0.1:
            point["price"] = format(self.decimal(Decimal(10), rng.choice((0, 2, 4))), "f")
        r = rng.random()
        if scope is None:
            if r < 0.2:
                point["scope"] = None
        elif r < 0.3:
            point["scope"] = scope
        elif r < 0.55:
            point["scope"] = scope
            groupby["project_id"] = scope
        elif r < 0.95:
            groupby["project_id"] = scope  # the scope comes from groupby.project_id
        else:
            point["scope"] = scope
            groupby["project_id"] = rng.choice([t for t in TENANT_POOL if t != scope])  # scope wins
        point["begin"] = self.instant_usage(begin)
        point["end"] = self.instant_usage(end)
        for fld in svc.fields if svc else ():
            if rng.random() < 0.12 or (fld.name == "project_id" and "project_id" in groupby):
                continue
            value = self.label(fld, bool(fld.rule.get("thresholds")))
            r = rng.random()
            if fld.name == "project_id" and scope is None:
                metadata[fld.name] = value  # in groupby it would become the point's scope
            elif r < 0.5:
                groupby[fld.name] = value
            elif r < 0.85:
                metadata[fld.name] = value
            else:
                groupby[fld.name] = value
                metadata[fld.name] = self.label(fld, False)  # groupby wins over metadata
        if self.json_rate:
            for labels in (groupby, metadata):
                for key, value in labels.items():
                    if key != "project_id" and rng.random() < self.json_rate:
                        labels[key] = self.json_label(value)
        if rng.random() < 0.3:
            metadata["noise"] = rng.choice(CATEGORIES)
        point["groupby"] = groupby
        point["metadata"] = metadata
        return point

    def json_label(self, value: str) -> Any:
        """A label as a JSON number or boolean, as Gnocchi metadata can carry (str() matches it,
        Decimal() compares it: ``Decimal(0.3)`` is the float's binary value, ``Decimal(True)`` is 1)."""
        if self.rng.random() < 0.15:
            return self.rng.choice((True, False))
        if value in NUMBERS and value.strip("+-").replace(".", "", 1).isdigit():
            number = Decimal(value)
            return int(number) if "." not in value else float(number)
        return value

    def instant_usage(self, value: datetime) -> str:
        return value.isoformat().replace("+00:00", "Z") if self.rng.random() < 0.8 else value.isoformat()

    def build(self, name: str) -> Case:
        services = [self.service(n) for n in self.rng.sample(SERVICE_POOL, self.rng.choice((1, 2, 2, 3, 4)))]
        for svc in services:
            self.fit_exactness(svc)
        usage = [self.point(services) for _ in range(self.n_points)]
        rules: dict[str, Any] = {}
        if self.rng.random() < 0.6:
            rules["groups"] = sorted(self.groups)
        rules["services"] = [svc.rule for svc in services]
        return Case(name, _stringify(rules, self.rng), usage)


def _group_bound(parents: list[dict[str, Any]], group: str, svc: _Service) -> tuple[int, int, list[dict]]:
    """(decimals, integer digits, cost-carrying rules) of the worst price a group can produce."""
    places = svc.qty_scale
    size = svc.qty_max
    members: list[dict[str, Any]] = []
    thresholds: list[dict[str, Any]] = []
    for parent in parents:
        mine = [m for m in parent.get("mappings", ()) if (m.get("group") or DEFAULT_GROUP) == group]
        thresholds += [t for t in parent.get("thresholds", ()) if (t.get("group") or DEFAULT_GROUP) == group]
        if mine:
            places += max(scale(m["cost"]) for m in mine)
            size *= max(Decimal(1), *(abs(m["cost"]) for m in mine))
            members += mine
    if thresholds:
        places += max(scale(t["cost"]) for t in thresholds)
        size *= max(Decimal(1), *(abs(t["cost"]) for t in thresholds)) + 1
        members += thresholds
    return places, _digits(size) + 1, members


def _stringify(doc: Any, rng: random.Random) -> Any:
    """Decimals become exact strings (sometimes JSON integers, as the format allows)."""
    if isinstance(doc, dict):
        return {k: _stringify(v, rng) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_stringify(v, rng) for v in doc]
    if isinstance(doc, Decimal):
        if doc == doc.to_integral_value() and abs(doc) < 1000 and rng.random() < 0.15:
            return int(doc)
        return format(doc, "f")
    return doc


def generate_case(seed: int | str, points: int = 200, name: str = "case") -> Case:
    """One case, fully determined by ``seed``."""
    return _Builder(random.Random(f"ratebeam-diff:{seed}"), points).build(name)


def generate_cases(seed: int, count: int, points: int = 200) -> list[Case]:
    """``count`` independent cases of one run; case ``i`` is ``generate_case(f"{seed}/{i}")``."""
    return [generate_case(f"{seed}/{i}", points, name=f"case{i:03d}") for i in range(count)]


# --- coverage of the known traps of CloudKitty's hashmap (`cloudkitty/rating/hash/__init__.py:159-276`) ---


def _rules_of(case: Case) -> list[tuple[str, str | None, str, dict[str, Any]]]:
    """(service, field, kind 'mapping'|'threshold', rule) for every rule of the case."""
    out = []
    for svc in case.rules["services"]:
        for kind in ("mapping", "threshold"):
            out += [(svc["name"], None, kind, r) for r in svc.get(kind + "s", ())]
        for fld in svc.get("fields", ()):
            for kind in ("mapping", "threshold"):
                out += [(svc["name"], fld["name"], kind, r) for r in fld.get(kind + "s", ())]
    return out


def traps_covered(case: Case) -> set[str]:
    """Which known traps of CloudKitty's hashmap (items 1-9) the case's input contains."""
    rules = _rules_of(case)
    found: set[str] = set()

    def grp(rule: dict[str, Any]) -> str:
        return rule.get("group") or DEFAULT_GROUP

    mappings = [(s, f, r) for s, f, k, r in rules if k == "mapping"]
    thresholds = [(s, f, r) for s, f, k, r in rules if k == "threshold"]
    by_group: dict[tuple[str, str], list[tuple[str | None, dict[str, Any]]]] = {}
    for s, f, r in mappings:
        by_group.setdefault((s, grp(r)), []).append((f, r))
    for members in by_group.values():
        kinds = {r.get("type", "flat") for _, r in members}
        if kinds == {"rate"}:
            found.add("1 rate-only group")
        flats = [r for _, r in members if r.get("type", "flat") == "flat"]
        if len({f for f, r in members if r.get("type", "flat") == "flat"}) > 1:
            found.add("2 max of flats")
        if any(Decimal(str(r["cost"])) < 0 for r in flats):
            found.add("2 negative flat")
        if len({f for f, _ in members}) > 1 and grp(members[0][1]) == DEFAULT_GROUP:
            found.add("3 _DEFAULT_ shared across parents")
    thr_groups: dict[tuple[str, str], list[tuple[str | None, Decimal]]] = {}
    for s, f, r in thresholds:
        thr_groups.setdefault((s, grp(r)), []).append((f, Decimal(str(r["level"]))))
        found.add(f"5 {'service' if f is None else 'field'} {r.get('type', 'flat')} threshold")
    for members in thr_groups.values():
        parents = {f for f, _ in members}
        if None in parents and len(parents) > 1:
            found.add("4 service vs field thresholds in one group")
        levels: dict[Decimal, set[str | None]] = {}
        for f, level in members:
            levels.setdefault(level, set()).add(f)
        if any(len(p) > 1 for p in levels.values()):
            found.add("4 threshold tie across parents")
    with_thresholds = {(s, f) for s, f, _ in thresholds if f is not None}
    labels = set()
    for p in case.usage:
        desc = {**p["metadata"], **p["groupby"]}
        labels |= {desc[f] for s, f in with_thresholds if p["type"] == s and f in desc}
        if any(k in p["groupby"] and p["groupby"][k] != v for k, v in p["metadata"].items()):
            found.add("9 groupby overrides metadata")
        if any(not isinstance(v, str) for v in desc.values()):
            found.add("9 JSON number or boolean labels")
    if "" in labels:
        found.add("6 empty label on a thresholded field")
    if labels & (set(NOT_NUMBERS) - {""}):
        found.add("6 non-numeric label on a thresholded field")
    spellings = labels & set(NUMBERS)
    if labels & set(ODD_NUMBERS) or len({Decimal(v) for v in spellings}) < len(spellings):
        found.add("6 numeric-looking spellings")
    tenants_per_key: dict[tuple[Any, ...], set[str | None]] = {}
    for s, f, r in mappings:
        tenants_per_key.setdefault((s, f, r.get("value"), grp(r)), set()).add(r.get("tenant_id"))
    if any(None in t and len(t) > 1 for t in tenants_per_key.values()):
        found.add("7 tenant overrides a global key")
    global_values = {k[:3] for k, t in tenants_per_key.items() if None in t}
    if any(None not in t and k[:3] in global_values for k, t in tenants_per_key.items()):
        found.add("7 tenant rule in another group")
    begins = {datetime.fromisoformat(p["begin"]) for p in case.usage}
    for _, _, r in mappings:
        for edge in ("start", "end"):
            if r.get(edge):
                moment = datetime.fromisoformat(r[edge])
                moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
                if moment in begins:
                    found.add(f"8 window {edge} == a period begin")
    if any(f is not None and r.get("value") in NUMBERS for _, f, r in mappings):
        found.add("9 str() match of numeric strings")
    return found


ALL_TRAPS = frozenset({
    "1 rate-only group", "2 max of flats", "2 negative flat", "3 _DEFAULT_ shared across parents",
    "4 service vs field thresholds in one group", "4 threshold tie across parents",
    "5 service flat threshold", "5 service rate threshold", "5 field flat threshold", "5 field rate threshold",
    "6 empty label on a thresholded field", "6 non-numeric label on a thresholded field",
    "6 numeric-looking spellings", "7 tenant overrides a global key", "7 tenant rule in another group",
    "8 window start == a period begin", "8 window end == a period begin", "9 groupby overrides metadata",
    "9 str() match of numeric strings", "9 JSON number or boolean labels",
})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write random differential cases.")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cases", type=int, default=3)
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    covered: set[str] = set()
    for case in generate_cases(args.seed, args.cases, args.points):
        rules, usage = case.write(args.out)
        covered |= traps_covered(case)
        print(rules, usage)
    print("traps not covered:", sorted(ALL_TRAPS - covered) or "none")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
