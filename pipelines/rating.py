"""Loading the rating step of a cycle: rules, module states and scripts, read once at launch.

The launcher reads them in a handful of SQL statements and ships them to workers inside the
picklable ``transforms.chain_rater.ChainRaterFactory``; the rating itself is pure and lives there.
"""

from __future__ import annotations

from sqlalchemy import Engine

from ratebeam.connectors.sql.rules_repository import load_rules, load_scripts, module_states
from ratebeam.transforms.chain_rater import ChainRaterFactory
from ratebeam.transforms.metric_defs import MetricsConfig

#: ratebeam's modules (CloudKitty's ``pyscripts`` is replaced by the safe ``scripted`` module).
MODULE_NAMES = ("hashmap", "noop", "scripted")


def load_rater(engine: Engine, metrics: MetricsConfig, *, lineage: bool = True) -> ChainRaterFactory:
    """Read rules, module states and scripts from the database (a few bulk statements).

    ``lineage``: rated points carry the ids of the rules that priced them (``docs/lineage.md``);
    backends whose capabilities say they cannot keep them never receive them.
    """
    states = module_states(engine, MODULE_NAMES)
    return ChainRaterFactory(
        rules=load_rules(engine),
        modules=tuple((s.name, s.enabled, s.priority) for s in states.values()),
        scripts=load_scripts(engine),
        metrics=metrics,
        lineage=lineage,
    )
