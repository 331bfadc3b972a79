"""The rating step of a cycle: the module chain, shipped to workers in a picklable factory.

The launcher loads the hashmap rules, the module states and the scripts once
(``pipelines.rating.load_rater``) and ships them inside a ``ChainRaterFactory``; each worker builds
its ``ChainRater`` once (``DoFn.setup``).  After the chain, the points each metric's
``skip_datapoints_expression`` selects are dropped, as CloudKitty does just before storage
(`cloudkitty/orchestrator.py:445-507`), and so is the exact quantities' ``qty_remainder`` (priced, never stored).  Pure: no I/O, so the same rater runs in tests, on the DirectRunner and on Flink.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import polars as pl

from ratebeam.transforms.frames import FrameOutcome
from ratebeam.transforms.metric_defs import MetricsConfig
from ratebeam.transforms.rating_modules import RatingModule, apply_chain
from ratebeam.transforms.rules import RuleSet
from ratebeam.transforms.schema import BEGIN, QTY_REMAINDER, TYPE
from ratebeam.transforms.scripted import load_script


class ScriptText(Protocol):
    """A stored script: its JSON text and its validity window (``connectors.sql`` provides them)."""

    @property
    def data(self) -> str:
        """The script's JSON text (``transforms.scripted.load_script`` reads it)."""
        ...

    def is_active(self, at: datetime) -> bool:
        """Whether the script applies to the period beginning ``at``."""
        ...


@dataclass(frozen=True)
class ChainRaterFactory:
    """Everything a worker needs to rate: picklable, built once per run by the launcher."""

    rules: RuleSet
    modules: tuple[tuple[str, bool, int], ...]  # (name, enabled, priority)
    scripts: tuple[ScriptText, ...]
    metrics: MetricsConfig
    #: the hashmap yields each point's rule ids (the ``RULES`` column), which storage may keep
    lineage: bool = False

    def __call__(self) -> ChainRater:
        """A rater for one worker (scripts are compiled here, on the worker)."""
        return ChainRater(self)


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
                out.append(RatingModule(name, "hashmap", enabled, priority, rules=self._factory.rules,
                                        lineage=self._factory.lineage))
            elif name == "noop":
                out.append(RatingModule(name, "noop", enabled, priority))
            elif name == "scripted":
                active = tuple(s for text, s in self._scripts if begin is None or text.is_active(begin))
                if active:
                    out.append(RatingModule(name, "scripted", enabled, priority, scripts=active))
        return out

    def __call__(self, usage: pl.DataFrame) -> tuple[pl.DataFrame, list[FrameOutcome]]:
        """Rate ``usage`` through the module chain, then drop the points ``skip_datapoints_expression`` skips."""
        # Scripts have validity windows: rate each group of periods that sees the same scripts.
        parts = [(None, usage)]
        if self._scripts:
            parts = [(p.item(0, BEGIN), p) for p in usage.partition_by(BEGIN, maintain_order=True)]
        rated, failures = [], []
        for begin, part in parts:
            outcome = apply_chain(part, self._modules(begin))
            rated.append(outcome.rated)
            failures += outcome.failures
        frame = pl.concat(rated, how="diagonal_relaxed") if len(rated) > 1 else rated[0]
        frame = frame.drop(QTY_REMAINDER, strict=False)
        if self._skip is not None:
            skip, labels = self._skip
            missing = [c for c in labels if c not in frame.columns]
            frame = (
                frame.with_columns(pl.lit(None, pl.String).alias(c) for c in missing)
                .filter(~skip)
                .drop(missing)
            )
        return frame, failures


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
