"""The pipeline's dead-letter output, kept in SQL so the launcher can report a run's failures.

Workers (on Flink as on the DirectRunner) write failed frames here; the launcher reads them back
by run id after the pipeline finished — the portable way to bring results home from a runner.
"""

from __future__ import annotations

from datetime import UTC, datetime

import apache_beam as beam
import sqlalchemy as sa

from ratebeam.connectors.sql.engine import make_engine, write_transaction
from ratebeam.connectors.sql.models import DeadLetter
from ratebeam.transforms.frames import FrameOutcome


class DeadLetterStore:
    """Reads and writes dead letters of one database."""

    def __init__(self, database_url: str) -> None:
        self.engine = make_engine(database_url)

    def add(self, run_id: str, failures: list[FrameOutcome]) -> None:
        """Record the failed frames of run ``run_id`` in one transaction."""
        if not failures:
            return
        now = datetime.now(UTC)
        rows = [
            {"run_id": run_id, "scope": f.scope_id, "period_begin": f.begin, "stage": f.stage,
             "reason": f.reason, "created_at": now}
            for f in failures
        ]
        with write_transaction(self.engine) as conn:
            conn.execute(sa.insert(DeadLetter), rows)

    def for_run(self, run_id: str) -> list[FrameOutcome]:
        """The failed frames of run ``run_id``, by scope, period and insertion order."""
        query = sa.select(DeadLetter).where(DeadLetter.run_id == run_id).order_by(
            DeadLetter.scope, DeadLetter.period_begin, DeadLetter.id
        )
        with self.engine.connect() as conn:
            return [
                FrameOutcome(r.scope, r.period_begin, False, r.stage, r.reason)
                for r in conn.execute(query)
            ]


class _WriteDeadLettersFn(beam.DoFn):
    def __init__(self, database_url: str, run_id: str) -> None:
        self._url = database_url
        self._run_id = run_id

    def setup(self) -> None:
        self._store = DeadLetterStore(self._url)

    def process(self, result: tuple):
        _scope, _last, failures = result
        self._store.add(self._run_id, failures)

    def teardown(self) -> None:
        store = getattr(self, "_store", None)
        if store is not None:
            store.engine.dispose()


class WriteDeadLetters(beam.PTransform):
    """CommitState's per-scope results → their failures stored under the run id."""

    def __init__(self, database_url: str, run_id: str) -> None:
        super().__init__()
        self._url = database_url
        self._run_id = run_id

    def expand(self, results: beam.PCollection) -> beam.PCollection:
        """Write the failed outcomes of ``results`` under this run's id."""
        return results | beam.ParDo(_WriteDeadLettersFn(self._url, self._run_id))
