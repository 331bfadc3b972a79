"""The rating module chain (`cloudkitty/orchestrator.py:257-265`): which modules run, in which order, on which rows.

CloudKitty runs every enabled module on each frame, highest priority first, feeding each module the
previous one's output; the hashmap *adds* its price to the incoming one, so two price-producing
modules add up.  ratebeam keeps those rules and runs them on whole batches: a frame one module fails
is reported once and left out of the following modules and of the result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import polars as pl

from ratebeam.transforms.frames import RATE_STAGE, FrameOutcome
from ratebeam.transforms.hashmap import RatingOutcome, rate
from ratebeam.transforms.rules import RuleSet
from ratebeam.transforms.schema import BEGIN, END, SCOPE
from ratebeam.transforms.scripted import Script, apply_scripts

ModuleKind = Literal["hashmap", "noop", "scripted"]
_ROW = "__rb_module_row"


@dataclass(frozen=True)
class RatingModule:
    """One module of the chain, as CloudKitty's ``modules_state`` row and module describe it.

    ``priority`` None or 0 reads as 1 (CloudKitty's DB API).  A ``hashmap`` module needs ``rules``;
    a ``scripted`` module needs ``scripts`` (applied in order); ``noop`` changes nothing.
    ``lineage``: the hashmap also yields each point's rule ids (``transforms.hashmap.rate``).
    """

    name: str
    kind: ModuleKind
    enabled: bool = True
    priority: int | None = None
    rules: RuleSet | None = None
    scripts: tuple[Script, ...] = ()
    lineage: bool = False

    def __post_init__(self) -> None:
        if self.kind == "hashmap" and self.rules is None:
            raise ValueError(f"rating module {self.name!r}: a hashmap module needs rules")
        if self.kind == "scripted" and not self.scripts:
            raise ValueError(f"rating module {self.name!r}: a scripted module needs scripts")
        if self.kind not in ("hashmap", "noop", "scripted"):
            raise ValueError(f"rating module {self.name!r}: unknown kind {self.kind!r}")

    @property
    def effective_priority(self) -> int:
        """The priority CloudKitty sorts by: a missing or zero priority reads as 1."""
        return self.priority or 1

    def process(self, frame: pl.DataFrame) -> RatingOutcome:
        """This module's output for a batch: its rated rows and the frames it failed."""
        if self.kind == "hashmap" and self.rules is not None:  # rules are checked in __post_init__
            return rate(frame, self.rules, lineage=self.lineage)
        if self.kind == "scripted":
            scripts = self.scripts
            return _per_frame_on_error(lambda part: apply_scripts(part, scripts), frame, self.name)
        return RatingOutcome(frame, [])


def ordered(modules: Sequence[RatingModule]) -> list[RatingModule]:
    """The enabled modules, highest effective priority first; ties keep the given order (stable)."""
    return sorted((m for m in modules if m.enabled), key=lambda m: -m.effective_priority)


def apply_chain(frame: pl.DataFrame, modules: Sequence[RatingModule]) -> RatingOutcome:
    """Run the enabled modules in priority order, each on the previous one's output.

    The result holds the rows of the frames no module failed; ``failures`` lists each failed
    (scope, begin, end) frame once, with the reason of the first module that failed it.
    """
    failures: list[FrameOutcome] = []
    for module in ordered(modules):
        outcome = module.process(frame)
        frame = outcome.rated
        failures += outcome.failures
    return RatingOutcome(frame, failures)


def _per_frame_on_error(process: Callable[[pl.DataFrame], pl.DataFrame], frame: pl.DataFrame,
                        name: str) -> RatingOutcome:
    """``process(frame)``; if it raises, run it per (scope, begin, end) frame.

    That way only the frames that fail on their own are failed, as CloudKitty fails one frame at a time.
    """
    try:
        return RatingOutcome(process(frame), [])
    except pl.exceptions.PolarsError:
        pass
    indexed = frame.with_row_index(_ROW)
    done, failures = [], []
    for part in indexed.partition_by(SCOPE, BEGIN, END, maintain_order=True):
        try:
            done.append(process(part.drop(_ROW)).with_columns(part.get_column(_ROW)))
        except pl.exceptions.PolarsError as err:
            message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            failures.append(FrameOutcome(part.item(0, SCOPE), part.item(0, BEGIN), False, RATE_STAGE,
                                         f"rating module {name!r}: {message}", end=part.item(0, END)))
    rated = pl.concat(done).sort(_ROW).drop(_ROW) if done else frame.clear()
    return RatingOutcome(rated, failures)
