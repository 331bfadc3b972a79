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
each step runs once.  A DoFn is
unpickled afresh in each bundle, so no two tasks of a worker share one.  Anything else is refused
before any task runs, in one line naming the transform (:class:`UnsupportedOnDask`).

Beam metrics are not collected (``DaskRunnerResult.metrics`` raises): ratebeam's figures come from
its graph (``transforms.tallies``), not from the runner.
"""

from __future__ import annotations

import dataclasses
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

from ratebeam.pipelines.runners import RunnerUnavailable

#: Partitions per worker thread a ``Reshuffle`` spreads work items over (load balance, finer recovery).
PARTITIONS_PER_THREAD = 2


class UnsupportedOnDask(RunnerUnavailable):
    """The graph has a transform this runner does not translate: one line, exit 2, before any task runs."""


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


def _run_bundle(items: Iterable[WindowedValue], fn_pickled: bytes, label: str, args: list[Any],
                kwargs: dict[str, Any], window_fn: Any) -> list[tuple[str | None, WindowedValue]]:
    """One partition as one bundle of a fresh DoFn: setup … finish_bundle, teardown; every output with its tag."""
    fn = pickler.loads(fn_pickled)
    receivers = _Receivers()
    handler = _OutputHandler(window_fn=window_fn, main_receivers=receivers[None], tagged_receivers=receivers,
                             per_element_output_counter=None, output_batch_converter=None,
                             process_yields_batches=False, process_batch_yields_elements=False)
    invoker = DoFnInvoker.create_invoker(
        DoFnSignature(fn), handler, context=DoFnContext(label, state=None), side_inputs=[], input_args=args,
        input_kwargs=kwargs, user_state_context=None, bundle_finalizer_param=core.DoFn.BundleFinalizerParam())
    invoker.invoke_setup()
    try:
        invoker.invoke_start_bundle()
        for item in items:
            invoker.invoke_process(item)
        invoker.invoke_finish_bundle()
    finally:
        invoker.invoke_teardown()
    return receivers.values


def _of_tag(outputs: Iterable[tuple[str | None, WindowedValue]], tag: str | None) -> list[WindowedValue]:
    return [value for t, value in outputs if t == tag]


def _windowed(item: Any) -> WindowedValue:
    return get_windowed_value(item, GlobalWindows())


def _value(item: Any) -> Any:
    return item.value if isinstance(item, WindowedValue) else item


@dataclasses.dataclass
class _Translator(PipelineVisitor):
    """Builds one bag per PCollection of the (overridden) pipeline; refuses what it cannot translate."""

    npartitions: int
    bags: dict[pvalue.PCollection, db.Bag] = dataclasses.field(default_factory=dict)
    consumed: set[pvalue.PCollection] = dataclasses.field(default_factory=set)

    def visit_transform(self, node: AppliedPTransform) -> None:
        transform = node.transform
        inputs = [i for i in node.inputs if isinstance(i, pvalue.PCollection)]
        self.consumed.update(inputs)
        outputs = list(node.outputs.items())
        kind = type(transform)
        if node.side_inputs:
            raise UnsupportedOnDask(f"{node.full_label} takes a side input, which the Dask runner does not pass")
        if kind is overrides._Create:
            bag = Create(node, bag_kwargs={"npartitions": 1}).apply(None).map(_windowed)
        elif kind is core.ParDo:
            self._pardo(node, inputs[0], outputs)
            return
        elif kind is overrides._GroupByKeyOnly:  # Beam's: a bag groupby of the values (global windows)
            bag = GroupByKey(node).apply(self.bags[inputs[0]].map(_value)).map(_windowed)
        elif kind is overrides._GroupAlsoByWindow:  # global windows only: the grouping is done
            bag = self.bags[inputs[0]]
        elif kind is overrides._Flatten:
            bag = db.concat([self.bags[i] for i in inputs])
        elif kind is overrides._Reshuffle:
            bag = self.bags[inputs[0]].repartition(npartitions=self.npartitions)
        else:
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
        tagged = self.bags[main].map_partitions(_run_bundle, pickler.dumps(transform.fn), node.full_label,
                                                list(args), dict(kwargs), window_fn)
        for _, pcoll in outputs:
            self.bags[pcoll] = tagged.map_partitions(_of_tag, pcoll.tag)

    def leaves(self) -> list[db.Bag]:
        """The bags nobody reads: computing them runs the whole graph."""
        return [bag for pcoll, bag in self.bags.items() if pcoll not in self.consumed]


class _Result(DaskRunnerResult):
    """Beam's result, closing the client once the job is over."""

    def wait_until_finish(self, duration: int | None = None) -> str:
        try:
            return super().wait_until_finish(duration)
        finally:
            if self._state != PipelineState.RUNNING:
                self.client.close()


class DaskRunner(BeamDaskRunner):
    """Runs a batch pipeline on the dask.distributed scheduler of ``--dask_client_address``."""

    def run_pipeline(self, pipeline: Any, options: PipelineOptions) -> _Result:
        """Translate every transform (or refuse the graph), then compute every leaf on the cluster."""
        dask_options = options.view_as(DaskOptions).get_all_options(drop_default=True, current_only=True)
        npartitions = DaskOptions._extract_bag_kwargs(dask_options).get("npartitions")
        pipeline.replace_all(overrides.dask_overrides())
        client = ddist.Client(**dask_options)
        try:
            threads = sum(client.nthreads().values())
            translator = _Translator(npartitions or max(1, PARTITIONS_PER_THREAD * threads))
            pipeline.visit(translator)
            # Not optimized: Dask's fusion copies a step that several consumers read (a ParDo
            # with tagged outputs) into each of them, and runs it once per consumer (a lease
            # taken twice, a write made twice).
            futures = client.compute(translator.leaves(), optimize_graph=False)
        except BaseException:
            client.close()
            raise
        return _Result(client, futures)
