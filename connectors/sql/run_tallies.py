"""The figures of a run, counted by its graph (``transforms.tallies``), kept in SQL until its launcher reads them.

``RecordTallies`` is the graph's last step: it sums every ``(name, n)`` tally of the run and
writes one row per name under the run id, in one transaction, replacing what is there (a step
that a runner runs again writes the same sums).  The launcher reads them with
:meth:`RunTallyStore.take` once the pipeline finished — the portable way to bring results home
from workers on other hosts, as for the dead letters — and that deletes them.
"""

from __future__ import annotations

from collections.abc import Iterable

import apache_beam as beam
import sqlalchemy as sa

from ratebeam.connectors.sql.engine import database_errors, dialect_insert, make_engine, write_transaction
from ratebeam.connectors.sql.models import RunTally


class RunTallyStore:
    """Reads and writes the run tallies of one database."""

    def __init__(self, database_url: str) -> None:
        self.engine = make_engine(database_url)

    def record(self, run_id: str, sums: dict[str, int]) -> None:
        """Store ``sums`` as run ``run_id``'s figures (one row per name, replaced if there)."""
        if not sums:
            return
        insert = dialect_insert(self.engine)(RunTally)
        upsert = insert.on_conflict_do_update(index_elements=[RunTally.run_id, RunTally.name],
                                              set_={"value": insert.excluded.value})
        with database_errors(self.engine, "record the run's tallies"), write_transaction(self.engine) as conn:
            conn.execute(upsert, [{"run_id": run_id, "name": name, "value": n} for name, n in sums.items()])

    def take(self, run_id: str) -> dict[str, int]:
        """Run ``run_id``'s figures, deleted from the table as they are read."""
        with database_errors(self.engine, "read the run's tallies"), write_transaction(self.engine) as conn:
            rows = conn.execute(sa.select(RunTally.name, RunTally.value).where(RunTally.run_id == run_id)).all()
            conn.execute(sa.delete(RunTally).where(RunTally.run_id == run_id))
        return {name: value for name, value in rows}


class _RecordFn(beam.DoFn):
    def __init__(self, database_url: str, run_id: str) -> None:
        self._url = database_url
        self._run_id = run_id

    def setup(self) -> None:
        self._store = RunTallyStore(self._url)

    def process(self, keyed: tuple[None, Iterable[tuple[str, int]]]) -> None:
        sums: dict[str, int] = {}
        for name, n in keyed[1]:
            sums[name] = sums.get(name, 0) + n
        self._store.record(self._run_id, sums)

    def teardown(self) -> None:
        store = getattr(self, "_store", None)
        if store is not None:
            store.engine.dispose()


class RecordTallies(beam.PTransform):
    """Every ``(name, n)`` tally of the run → their sums per name, stored under the run id."""

    def __init__(self, database_url: str, run_id: str) -> None:
        super().__init__()
        self._url = database_url
        self._run_id = run_id

    def expand(self, tallies: beam.PCollection) -> beam.PCollection:
        """Gather the tallies on one key, sum them there and write the sums."""
        return (tallies
                | "OneKey" >> beam.Map(lambda tally: (None, tally))
                | "Gather" >> beam.GroupByKey()
                | "Record" >> beam.ParDo(_RecordFn(self._url, self._run_id)))
