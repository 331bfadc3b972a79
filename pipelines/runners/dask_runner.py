"""Beam's DaskRunner, translated so that ratebeam's batch graphs run on dask.distributed as on FnApiRunner.

Beam 2.75's ``apache_beam.runners.dask`` translates ``Create``, ``ParDo``, ``GroupByKey``,
``Flatten`` and ``Reshuffle`` into Dask bags, but (tried on a scheduler and a worker, see
``docs/dask.md``):

* every output of a multi-output ``ParDo`` lands in one bag: a consumer of the main output also
  receives the tagged ones (ratebeam's stages all have a ``failures`` output);
* what a DoFn outputs in ``finish_bundle`` is dropped (the writer acknowledges frames there);
* ``Reshuffle`` is an identity: the work items stay in the one partition of the cycle's tick, so
  one worker does all the work;
* only the bag of the last transform is computed: a branch that does not feed it never runs;
* that bag is optimised, and Dask's fusion copies a step several consumers read into each of them:
  the step runs once per consumer (a lease taken twice, a batch written twice);
* any other primitive (``WindowInto``, ``Impulse``, a side input) silently becomes an identity.

This runner keeps Beam's overrides (``dask_overrides``) and its ``Create`` and ``GroupByKey``
translations, and translates the rest itself: each ``ParDo`` bundle (a partition) keeps the tag
of every output and runs ``finish_bundle`` before its outputs are taken, each consumer reads the
outputs of its own tag, ``Reshuffle`` spreads the items over ``npartitions`` partitions (twice the
cluster's worker threads unless given), and every leaf of the graph is computed, unoptimised, so
each step runs once.  Anything else is refused before any task runs, in one line naming the
transform (:class:`UnsupportedOnDask`).

What Dask does on its own and a rating run cannot take, handled here:

* **Recomputation.**  Dask recomputes a finished task whose result was lost with a worker, against
  a state that has moved on (a recomputed planning step finds its scopes committed: "0 due").  The
  ``tallies`` a bundle emits (``transforms.tallies``) are therefore recorded on the scheduler under
  the task's key and the element's position in its partition as soon as that element is done, the
  first record winning; a bundle emits the recorded tallies of its task, never its own recount.
  So each element is counted once, as the computation that did the work counted it, and the
  run's figures are FnApiRunner's whatever Dask recomputes.
* **A scheduler that is not one.**  The launcher asks first, in a bounded handshake
  (``runners.dask_handshake``); whatever answers instead is named.
* **A stall.**  Bundles report their progress to the scheduler as they go; the launcher watches
  it, the running tasks and the workers, while the job computes and while it fetches results
  (``runners.dask_watch``), and cancels a job that made no progress for ``--dask_stall_seconds``
  (``DaskJobStalled``, exit 1; the caller gives the leases back).
* **Setup.**  A DoFn is unpickled and set up once per worker and job, and reused by every bundle
  of that worker (as Beam's own workers reuse DoFns), not once per partition: clients, the file
  collector's index and the rater are built once per worker (``--dask_setup=partition`` restores
  a fresh DoFn per bundle).

Beam metrics are not collected (``DaskRunnerResult.metrics`` raises): ratebeam's figures come from
its graph (``transforms.tallies``), not from the runner.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any

import dask.bag as db
import dask.distributed as ddist
from apache_beam import pvalue
from apache_beam.internal import pickler
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor
from apache_beam.runners.common import DoFnContext, DoFnInvoker, DoFnSignature, Receiver, _OutputHandler
from apache_beam.runners.dask import overrides
from apache_beam.runners.dask.dask_runner import DaskOptions, DaskRunnerResult
from apache_beam.runners.dask.dask_runner import DaskRunner as BeamDaskRunner
from apache_beam.runners.dask.transform_evaluator import Create, GroupByKey, get_windowed_value
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import core
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.windowed_value import WindowedValue

from ratebeam.pipelines.runners.dask_watch import DaskJob, Watch
from ratebeam.pipelines.runners.launch import RunnerUnavailable
from ratebeam.transforms.tallies import TALLIES

LOG = logging.getLogger(__name__)
#: Partitions per worker thread a ``Reshuffle`` spreads work items over (load balance, finer recovery).
PARTITIONS_PER_THREAD = 2
#: Seconds between two progress reports of a running bundle (at most).
BEAT_SECONDS = 1.0


class UnsupportedOnDask(RunnerUnavailable):
    """The graph has a transform this runner does not translate: one line, exit 2, before any task runs."""


class RatebeamDaskOptions(PipelineOptions):
    """ratebeam's options of its Dask runner (set by ``runners.launched`` from the runner config's ``dask`` keys)."""

    @classmethod
    def _add_argparse_args(cls, parser: Any) -> None:
        parser.add_argument("--dask_stall_seconds", type=float, default=300.0,
                            help="cancel the job when it made no progress for this long (seconds)")
        parser.add_argument("--dask_setup", choices=("worker", "partition"), default="worker",
                            help="set each DoFn up once per worker (default) or once per partition")


# --- bundles on the workers ----------------------------------------------------------------------

@dataclasses.dataclass
class _Tagging(Receiver):
    """Receives one output tag's windowed values into the bundle's list, tag kept."""

    tag: str | None
    into: list[tuple[str | None, WindowedValue]]

    def receive(self, windowed_value: WindowedValue) -> None:
        self.into.append((self.tag, windowed_value))


class _Receivers(dict):
    """The receivers of one bundle, one per output tag as the DoFn uses them."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[tuple[str | None, WindowedValue]] = []

    def __missing__(self, tag: str | None) -> _Tagging:
        self[tag] = receiver = _Tagging(tag, self.values)
        return receiver


class _DoFnPool:
    """A worker's DoFns set up for a job, idle between bundles: setup once per worker, not per partition.

    Keyed by the job and the pickled DoFn (its configuration), so two jobs never share one and a
    bundle takes an instance no other thread uses.  The launcher tears a job's down at its end
    (:func:`_release_job`); those of a job that ended otherwise (cancelled, its launcher gone) are
    torn down once idle for ``IDLE_SECONDS``, and what is left when the worker exits then.
    """

    IDLE_SECONDS = 600.0

    def __init__(self) -> None:
        self._idle: dict[tuple[str, str], list[Any]] = {}
        self._used: dict[str, float] = {}
        self._lock = threading.Lock()
        #: DoFn setups done in this process (read by bench/bench_dask_scaling.py).
        self.setups = 0

    def take(self, job: str, fn_pickled: bytes) -> tuple[tuple[str, str], Any | None]:
        """The pool's key of this DoFn, and an idle instance of it set up before (None: make one)."""
        key = (job, hashlib.sha256(fn_pickled).hexdigest())
        now = time.monotonic()
        with self._lock:
            self._used[job] = now
            stale = [j for j, used in self._used.items() if now - used > self.IDLE_SECONDS]
            idle = self._idle.get(key)
            fn = idle.pop() if idle else None
        for old in stale:
            self.release(old)
        return key, fn

    def put(self, key: tuple[str, str], fn: Any) -> None:
        """Give ``fn`` back, idle, after its bundle."""
        with self._lock:
            self._idle.setdefault(key, []).append(fn)

    def counted_setup(self) -> None:
        """Count one DoFn set up in this process."""
        with self._lock:
            self.setups += 1

    def release(self, job: str | None = None) -> int:
        """Tear down the idle DoFns of ``job`` (all when None); how many."""
        with self._lock:
            keys = [k for k in self._idle if job is None or k[0] == job]
            fns = [fn for k in keys for fn in self._idle.pop(k)]
            for name in [j for j in self._used if job is None or j == job]:
                del self._used[name]
        for fn in fns:
            try:
                fn.teardown()
            except Exception:  # a teardown failing must not stop the others
                LOG.exception("teardown of a pooled %s failed", type(fn).__name__)
        return len(fns)


POOL = _DoFnPool()
atexit.register(POOL.release)


def _release_job(job: str) -> int:
    """Run on every worker at the job's end (``Client.run``): its DoFns torn down."""
    return POOL.release(job)


def _setup_count() -> int:
    """Run on a worker (``Client.run``): the DoFn setups it did so far."""
    return POOL.setups


class _Ledger:
    """What a task tells the scheduler: its progress, and the tallies of each element it finished.

    Keys are the job, the task's key (the same when Dask recomputes the task) and the element's
    step and position in its partition; the first record of an element wins.  Outside a Dask
    worker (no current task) it keeps nothing.
    """

    def __init__(self, job: str) -> None:
        self._job = job
        try:
            worker = ddist.get_worker()
            self._task = repr(worker.get_current_task())
            self._client: ddist.Client | None = ddist.get_client()
        except ValueError:  # not in a worker's task
            self._client = None
        self._done = 0
        self._beat = 0.0

    def element_done(self, element: str, outputs: list[tuple[Any, WindowedValue]], start: int) -> None:
        """Record the tallies ``outputs[start:]`` hold for ``element`` (unless recorded before); beat now and then."""
        self._done += 1
        if self._client is None:
            return
        tallies = [list(value.value) for tag, value in outputs[start:] if tag == TALLIES]
        if tallies:
            path = [self._job, "tallies", self._task, element]
            if self._client.get_metadata(path, default=None) is None:
                self._client.set_metadata(path, tallies)
        now = time.monotonic()
        if now - self._beat >= BEAT_SECONDS:
            self._beat = now
            self._client.set_metadata([self._job, "progress", self._task], self._done)

    def recorded(self) -> dict[int, list[tuple[str, int]]] | None:
        """Every tally recorded for this task by step, by whichever computation of it did each element first."""
        if self._client is None:
            return None
        self._client.set_metadata([self._job, "progress", self._task], f"done {self._done}")
        by_step: dict[int, list[tuple[str, int]]] = {}
        for element, tallies in self._client.get_metadata([self._job, "tallies", self._task], default={}).items():
            by_step.setdefault(int(element.split("/")[0]), []).extend((name, n) for name, n in tallies)
        return by_step


@dataclasses.dataclass(frozen=True)
class _Step:
    """One ParDo of a fused stage: its pickled DoFn, and the tag of the previous step's output it reads."""

    fn_pickled: bytes
    label: str
    args: list[Any]
    kwargs: dict[str, Any]
    window_fn: Any
    input_tag: Any = None


def _run_bundle(step: _Step, n: int, items: Iterable[WindowedValue], job: str, per_partition: bool,
                ledger: _Ledger) -> list[tuple[Any, WindowedValue]]:
    """``items`` as one bundle of the worker's DoFn of ``step`` (the ``n``-th of its stage); every output with its tag."""
    key, fn = POOL.take(job, step.fn_pickled)
    fresh = fn is None or per_partition
    if fresh:
        fn = pickler.loads(step.fn_pickled)
    receivers = _Receivers()
    handler = _OutputHandler(window_fn=step.window_fn, main_receivers=receivers[None], tagged_receivers=receivers,
                             per_element_output_counter=None, output_batch_converter=None,
                             process_yields_batches=False, process_batch_yields_elements=False)
    invoker = DoFnInvoker.create_invoker(
        DoFnSignature(fn), handler, context=DoFnContext(step.label, state=None), side_inputs=[],
        input_args=step.args, input_kwargs=step.kwargs, user_state_context=None,
        bundle_finalizer_param=core.DoFn.BundleFinalizerParam())
    if fresh:
        POOL.counted_setup()
        invoker.invoke_setup()
    try:
        invoker.invoke_start_bundle()
        for i, item in enumerate(items):
            start = len(receivers.values)
            invoker.invoke_process(item)
            ledger.element_done(f"{n}/{i}", receivers.values, start)
        start = len(receivers.values)
        invoker.invoke_finish_bundle()
        ledger.element_done(f"{n}/finish_bundle", receivers.values, start)
    except BaseException:
        invoker.invoke_teardown()  # as Beam does: a DoFn that failed is not used again
        raise
    if per_partition:
        invoker.invoke_teardown()
    else:
        POOL.put(key, fn)
    return receivers.values


def _run_stage(items: Iterable[WindowedValue], steps: tuple[_Step, ...], job: str,
               per_partition: bool) -> list[tuple[tuple[int, Any], WindowedValue]]:
    """One partition through a stage of fused ParDos, each a bundle fed by its predecessor's output in memory.

    Returns the outputs nobody in the stage read, tagged (step, tag); the tallies are the recorded
    ones of this task (:class:`_Ledger`), not this computation's own.
    """
    ledger = _Ledger(job)
    outputs: list[tuple[tuple[int, Any], WindowedValue]] = []
    for n, step in enumerate(steps):
        values = _run_bundle(step, n, items, job, per_partition, ledger)
        fused = steps[n + 1].input_tag if n + 1 < len(steps) else _UNREAD
        items = [v for t, v in values if t == fused]
        outputs += [((n, t), v) for t, v in values if t != fused]
    recorded = ledger.recorded()
    if recorded is None:
        return outputs
    return ([(tag, v) for tag, v in outputs if tag[1] != TALLIES]
            + [((n, TALLIES), _windowed(t)) for n, tallies in recorded.items() for t in tallies])


#: A tag no output has: the last step of a stage feeds no step.
_UNREAD = object()


def _of_tag(outputs: Iterable[tuple[Any, WindowedValue]], tag: Any) -> list[WindowedValue]:
    return [value for t, value in outputs if t == tag]


def _windowed(item: Any) -> WindowedValue:
    return get_windowed_value(item, GlobalWindows())


def _value(item: Any) -> Any:
    return item.value if isinstance(item, WindowedValue) else item


# --- the translation -----------------------------------------------------------------------------

class _Consumers(PipelineVisitor):
    """How many transforms read each PCollection (a ParDo read by one other ParDo alone is fused into it)."""

    def __init__(self) -> None:
        self.count: dict[pvalue.PCollection, int] = {}

    def visit_transform(self, node: AppliedPTransform) -> None:
        for pcoll in node.inputs:
            if isinstance(pcoll, pvalue.PCollection):
                self.count[pcoll] = self.count.get(pcoll, 0) + 1


@dataclasses.dataclass
class _Stage:
    """ParDos fused into one task per partition; its bag is made when an output is first read from outside."""

    source: db.Bag
    steps: list[_Step]
    bag: db.Bag | None = None


@dataclasses.dataclass
class _Translator(PipelineVisitor):
    """Builds one bag per PCollection of the (overridden) pipeline; refuses what it cannot translate.

    A ParDo whose input is the output of a ParDo that nobody else reads joins that ParDo's stage
    (:func:`_run_stage`): the batches between them stay in the task, never a task result that
    Dask could move to another worker (pickled) or hold.

    A ``Reshuffle`` is a checkpoint, as Beam means it (Dataflow materialises there, so that what
    is upstream is not run again): everything computed before it that is read after it is
    computed first (:meth:`DaskJob.checkpoint`) and enters the rest of the graph as data.  Dask
    never recomputes the steps before it, so a lost worker never makes the planning step plan
    again against a state that its own run has moved (more periods than one run's cap, or none).
    """

    job: DaskJob
    npartitions: int
    per_partition: bool
    consumers: dict[pvalue.PCollection, int]
    bags: dict[pvalue.PCollection, db.Bag] = dataclasses.field(default_factory=dict)
    #: Outputs of ParDos: their stage, the step and the tag.
    staged: dict[pvalue.PCollection, tuple[_Stage, int, Any]] = dataclasses.field(default_factory=dict)
    #: How many of its readers each PCollection had so far.
    read: dict[pvalue.PCollection, int] = dataclasses.field(default_factory=dict)
    #: Leaves computed at a checkpoint already.
    computed: set[pvalue.PCollection] = dataclasses.field(default_factory=set)

    def bag(self, pcoll: pvalue.PCollection) -> db.Bag:
        """The bag of ``pcoll``; for a ParDo's output, its stage is closed (made a bag) first."""
        if pcoll not in self.bags:
            stage, n, tag = self.staged[pcoll]
            if stage.bag is None:
                stage.bag = stage.source.map_partitions(_run_stage, tuple(stage.steps), self.job.name,
                                                        self.per_partition)
                self.job.watch.labels[stage.bag.name] = " + ".join(step.label for step in stage.steps)
            self.bags[pcoll] = stage.bag.map_partitions(_of_tag, (n, tag))
        return self.bags[pcoll]

    def visit_transform(self, node: AppliedPTransform) -> None:
        transform = node.transform
        inputs = [i for i in node.inputs if isinstance(i, pvalue.PCollection)]
        outputs = list(node.outputs.items())
        kind = type(transform)
        if node.side_inputs:
            raise UnsupportedOnDask(f"{node.full_label} takes a side input, which the Dask runner does not pass")
        if kind is overrides._Reshuffle:
            bag = self._checkpoint(inputs[0])
        for pcoll in inputs:
            self.read[pcoll] = self.read.get(pcoll, 0) + 1
        if kind is overrides._Create:
            bag = Create(node, bag_kwargs={"npartitions": 1}).apply(None).map(_windowed)
        elif kind is core.ParDo:
            self._pardo(node, inputs[0], outputs)
            return
        elif kind is overrides._GroupByKeyOnly:  # Beam's: a bag groupby of the values (global windows)
            bag = GroupByKey(node).apply(self.bag(inputs[0]).map(_value)).map(_windowed)
        elif kind is overrides._GroupAlsoByWindow:  # global windows only: the grouping is done
            bag = self.bag(inputs[0])
        elif kind is overrides._Flatten:
            bag = db.concat([self.bag(i) for i in inputs])
        elif kind is not overrides._Reshuffle:
            raise UnsupportedOnDask(f"{node.full_label} is a {kind.__name__}, which the Dask runner does not run")
        for _, pcoll in outputs:
            self.bags[pcoll] = bag

    def _pardo(self, node: AppliedPTransform, main: pvalue.PCollection,
               outputs: list[tuple[Any, pvalue.PCollection]]) -> None:
        transform = node.transform
        args, kwargs = transform.raw_side_inputs
        window_fn = main.windowing.windowfn
        if not isinstance(window_fn, GlobalWindows):
            raise UnsupportedOnDask(f"{node.full_label} runs in {type(window_fn).__name__} windows; the Dask runner "
                                    "runs the global window only")
        step = _Step(pickler.dumps(transform.fn), node.full_label, list(args), dict(kwargs), window_fn)
        before = self.staged.get(main)
        if before is not None and before[0].bag is None and self.consumers.get(main) == 1 \
                and before[1] == len(before[0].steps) - 1:
            stage = before[0]
            stage.steps.append(dataclasses.replace(step, input_tag=before[2]))
        else:
            stage = _Stage(self.bag(main), [step])
        for _, pcoll in outputs:
            self.staged[pcoll] = (stage, len(stage.steps) - 1, pcoll.tag)

    def _known(self) -> list[pvalue.PCollection]:
        return list(dict.fromkeys([*self.bags, *self.staged]))

    def _checkpoint(self, shuffled: pvalue.PCollection) -> db.Bag:
        """Compute what is read after this point (and the leaves so far); they become data.

        Returns ``shuffled`` as data spread over ``npartitions`` partitions.
        """
        later = [pc for pc in self._known() if pc not in self.computed
                 and (self.read.get(pc, 0) < self.consumers.get(pc, 0) or not self.consumers.get(pc))]
        values = self.job.checkpoint([self.bag(pc) for pc in later])
        for pcoll, computed in zip(later, values, strict=True):
            self.staged.pop(pcoll, None)
            if self.consumers.get(pcoll):
                self.bags[pcoll] = db.from_sequence(computed, npartitions=1)
            else:
                self.computed.add(pcoll)
        return db.from_sequence(values[later.index(shuffled)], npartitions=self.npartitions)

    def leaves(self) -> list[db.Bag]:
        """The bags nobody reads: computing them runs the whole graph (after the last checkpoint)."""
        return [self.bag(pcoll) for pcoll in self._known() if not self.consumers.get(pcoll)
                and pcoll not in self.computed]


class _Result(DaskRunnerResult):
    """Beam's result, watching the job while it waits (:meth:`DaskJob.wait`), and ending it once it is over."""

    def __init__(self, job: DaskJob, futures: list[ddist.Future]) -> None:
        super().__init__(job.client, futures)
        self._job = job

    def wait_until_finish(self, duration: int | None = None) -> str:
        """Until every leaf is computed (an error of a task raised here), or the job stalls (cancelled, raised)."""
        deadline = None if duration is None else time.monotonic() + duration / 1000
        try:
            if self._job.wait(list(self.futures), deadline):
                self._state = PipelineState.DONE
        except BaseException:
            self._state = PipelineState.FAILED
            raise
        finally:
            if self._state != PipelineState.RUNNING:
                self._job.end(self._state == PipelineState.DONE)
        return self._state


class DaskRunner(BeamDaskRunner):
    """Runs a batch pipeline on the dask.distributed scheduler of ``--dask_client_address``."""

    def run_pipeline(self, pipeline: Any, options: PipelineOptions) -> _Result:
        """Translate every transform (or refuse the graph), running it up to each checkpoint; then compute its leaves."""
        dask_options = options.view_as(DaskOptions).get_all_options(drop_default=True, current_only=True)
        npartitions = DaskOptions._extract_bag_kwargs(dask_options).get("npartitions")
        ours = options.view_as(RatebeamDaskOptions)
        pipeline.replace_all(overrides.dask_overrides())
        client = ddist.Client(**dask_options)
        name = f"ratebeam-{uuid.uuid4().hex[:12]}"
        job = DaskJob(client, name, Watch(client, name, ours.dask_stall_seconds), _release_job)
        try:
            threads = sum(client.nthreads().values())
            consumers = _Consumers()
            pipeline.visit(consumers)
            translator = _Translator(job, npartitions or max(1, PARTITIONS_PER_THREAD * threads),
                                     ours.dask_setup == "partition", consumers.count)
            pipeline.visit(translator)
            # Not optimized: Dask's fusion copies a step that several consumers read (a ParDo
            # with tagged outputs) into each of them, and runs it once per consumer (a lease
            # taken twice, a write made twice).
            futures = client.compute(translator.leaves(), optimize_graph=False)
            LOG.debug("Dask job %s: stages %s", name, list(job.watch.labels.values()))
        except BaseException:
            job.end(False)
            raise
        return _Result(job, futures)
