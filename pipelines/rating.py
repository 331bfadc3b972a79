"""The rating step of a cycle: the module chain, loaded once at launch, applied on workers.

The launcher loads the hashmap rules, the module states and the scripts in a handful of SQL
statements and ships them inside a picklable factory; each worker builds its rater once
(``DoFn.setup``).  After the chain, the points each metric's ``skip_datapoints_expression`` selects
are dropped, as CloudKitty does just before storage (spec §6.6).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import polars as pl
from sqlalchemy import Engine

from ratebeam.connectors.sql.rules_repository import StoredScript, load_rules, load_scripts, module_states
from ratebeam.transforms.frames import Frame
from ratebeam.transforms.hashmap import FrameFailure
from ratebeam.transforms.metric_defs import MetricsConfig
from ratebeam.transforms.rating_modules import RatingModule, apply_chain
from ratebeam.transforms.rules import RuleSet
from ratebeam.transforms.schema import BEGIN, TYPE
from ratebeam.transforms.scripted import load_script

#: ratebeam's modules (CloudKitty's ``pyscripts`` is replaced by the safe ``scripted`` module).
MODULE_NAMES = ("hashmap", "noop", "scripted")


@dataclass(frozen=True)
class ChainRaterFactory:
    """Everything a worker needs to rate: picklable, built once per run by the launcher."""

    rules: RuleSet
    modules: tuple[tuple[str, bool, int], ...]  # (name, enabled, priority)
    scripts: tuple[StoredScript, ...]
    metrics: MetricsConfig

    def __call__(self) -> ChainRater:
        return ChainRater(self)


def load_rater(engine: Engine, metrics: MetricsConfig) -> ChainRaterFactory:
    """Read rules, module states and scripts from the database (a few bulk statements)."""
    states = module_states(engine, MODULE_NAMES)
    return ChainRaterFactory(
        rules=load_rules(engine),
        modules=tuple((s.name, s.enabled, s.priority) for s in states.values()),
        scripts=load_scripts(engine),
        metrics=metrics,
    )


class ChainRater:
    """usage frame → (rated frame, failed frames): the ``Rater`` of ``transforms.rate_dofn``."""

    def __init__(self, factory: ChainRaterFactory) -> None:
        self._factory = factory
        self._scripts = tuple((s, load_script(s.data)) for s in factory.scripts)
        self._skip = _skip_filter(factory.metrics)

    def _modules(self, begin: datetime | None) -> list[RatingModule]:
        out = []
        for name, enabled, priority in self._factory.modules:
            if name == "hashmap":
                out.append(RatingModule(name, "hashmap", enabled, priority, rules=self._factory.rules))
            elif name == "noop":
                out.append(RatingModule(name, "noop", enabled, priority))
            elif name == "scripted":
                active = tuple(s for text, s in self._scripts if begin is None or text.is_active(begin))
                if active:
                    out.append(RatingModule(name, "scripted", enabled, priority, scripts=active))
        return out

    def __call__(self, usage: pl.DataFrame) -> tuple[pl.DataFrame, list[tuple[Frame, str]]]:
        # Scripts have validity windows: rate each group of periods that sees the same scripts.
        parts = [(None, usage)]
        if self._scripts:
            parts = [(p.item(0, BEGIN), p) for p in usage.partition_by(BEGIN, maintain_order=True)]
        rated, failures = [], []
        for begin, part in parts:
            outcome = apply_chain(part, self._modules(begin))
            rated.append(outcome.rated)
            failures += [_frame(f) for f in outcome.failures]
        frame = pl.concat(rated, how="diagonal_relaxed") if len(rated) > 1 else rated[0]
        if self._skip is not None:
            skip, labels = self._skip
            missing = [c for c in labels if c not in frame.columns]
            frame = (
                frame.with_columns(pl.lit(None, pl.String).alias(c) for c in missing)
                .filter(~skip)
                .drop(missing)
            )
        return frame, failures


def _frame(failure: FrameFailure) -> tuple[Frame, str]:
    return Frame(failure.scope_id or "", failure.begin), failure.reason


def _skip_filter(metrics: MetricsConfig) -> tuple[pl.Expr, list[str]] | None:
    """What a metric's ``skip_datapoints_expression`` drops, and the label columns it reads.

    None when no metric has one.  A label a batch lacks reads as null (the point is kept).
    """
    skips = [(m.rating_type, m.skip_datapoints_expression) for m in metrics.metrics
             if m.skip_datapoints_expression is not None]
    if not skips:
        return None
    terms = [(pl.col(TYPE) == rating_type) & skip.to_polars() for rating_type, skip in skips]
    labels = sorted({f"{section}.{key}" for _, skip in skips for section, key in skip.labels()})
    return pl.any_horizontal(terms), labels
