"""SIGKILL against the Delta backend: a killed writer leaves each slice old or new, and whatever it
left on disk (data files no commit references) is counted, then removed by the next compaction.
End to end, a run killed between writes and rerun stores the clean run's rows.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pipeline_support import counters, delta_workspace, ratebeam, run_cycle, setup_database, stored_rows
from storage_conformance import HOUR, JANUARY, T0, point, rated_table

from ratebeam.connectors.storage.delta.backend import DeltaStorage

SLICES = [(t, h) for t in ("cpu", "ram") for h in range(4)]
#: Points per slice: a write of all slices takes long enough to be killed in the middle.
POINTS = 2000
TRIALS = 8

WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from storage_conformance import T0, HOUR, point, rated_table
    from ratebeam.connectors.storage.delta.backend import DeltaStorage
    backend = DeltaStorage({url!r}, compact_files=0)
    generation = {first}
    while True:
        backend.write(rated_table([point("p1", t, T0 + h * HOUR, str(generation), groupby={{"id": str(i)}})
                                   for t, h in {slices!r} for i in range({points})]))
        generation += 1
""")


def _slice_generations(backend: DeltaStorage) -> dict[tuple[str, object], set]:
    got: dict[tuple[str, object], list] = {}
    for row in backend.retrieve(*JANUARY, limit=1 << 30).points.select(["type", "begin", "qty"]).to_pylist():
        got.setdefault((row["type"], row["begin"]), []).append(row["qty"])
    for key, qtys in got.items():
        assert len(qtys) == POINTS, (key, len(qtys))  # a whole slice, never half, never twice
    return {key: set(qtys) for key, qtys in got.items()}


@pytest.mark.slow
def test_killed_writers_leave_whole_slices_and_compaction_removes_their_debris(tmp_path):
    url = str(tmp_path / "rated")
    backend = DeltaStorage(url, compact_files=0)
    backend.init()
    backend.write(rated_table([point("p1", t, T0 + h * HOUR, "0", groupby={"id": str(i)})
                               for t, h in SLICES for i in range(POINTS)]))
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    debris_per_trial = []
    for trial in range(TRIALS):
        script = WRITER.format(tests=str(Path(__file__).parent), url=url, first=1000 * (trial + 1),
                               slices=SLICES, points=POINTS)
        writer = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
        time.sleep(rng.uniform(1.5, 3.0))  # imports take ~1 s: some kills land before the first commit
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=60)
        generations = _slice_generations(backend)
        assert set(generations) == {(t, T0 + h * HOUR) for t, h in SLICES}
        assert all(len(g) == 1 for g in generations.values()), generations  # one write's points per slice
        assert len({next(iter(g)) for g in generations.values()}) == 1  # all slices of one commit
        debris_per_trial.append(len(backend.debris()))
    print(f"seed {seed}: unreferenced files after each kill: {debris_per_trial}")
    counts = backend.compact(retention_hours=0)
    assert counts["vacuumed"] >= debris_per_trial[-1]
    assert backend.debris() == []
    on_disk = [p for p in (tmp_path / "rated").rglob("*") if p.is_file() and "_delta_log" not in p.parts]
    assert len(on_disk) == counts["files_after"] == 1
    backend.close()


@pytest.mark.slow
def test_sigkill_between_writes_then_rerun_stores_the_clean_rows_and_compact_leaves_no_debris(tmp_path):
    clean = delta_workspace(tmp_path / "clean", rebatch_rows=40)
    setup_database(clean)
    assert run_cycle(clean).returncode == 0
    config = delta_workspace(tmp_path / "ws", rebatch_rows=40)
    setup_database(config)
    crashed = run_cycle(config, env={"RATEBEAM_FAILPOINT": "write:7"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    rerun = run_cycle(config)  # at once: the dead run's leases are taken over
    assert rerun.returncode == 0, rerun.stderr
    assert counters(rerun.stdout)["due"] == counters(rerun.stdout)["committed"]
    assert stored_rows(config).equals(stored_rows(clean))
    compact = ratebeam("storage", "compact", "-c", str(config), "--retention-hours", "0", "-f", "json")
    assert compact.returncode == 0, compact.stderr
    assert '"files_after": 1' in compact.stdout, compact.stdout
    assert DeltaStorage(str(config.parent / "rated")).debris() == []
    assert stored_rows(config).equals(stored_rows(clean))
