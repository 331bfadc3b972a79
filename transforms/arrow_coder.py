"""A Beam coder for Arrow record batches: batches cross Beam boundaries as Arrow IPC, not pickle.

Why: pickling a zero-copy slice drags its parent's buffers along (hundreds of MB for a small slice
of a big table), and Beam calls ``estimate_size`` on sampled elements even inside a fused stage, so
the estimate must not encode the batch.  Schema metadata (the frame manifest) survives the trip.
"""

from __future__ import annotations

import apache_beam as beam
import pyarrow as pa


class ArrowRecordBatchCoder(beam.coders.Coder):
    """Encodes one ``pa.RecordBatch`` as an Arrow IPC stream (schema + one batch)."""

    def encode(self, value: pa.RecordBatch) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, value.schema) as writer:
            writer.write_batch(value)
        return sink.getvalue().to_pybytes()

    def decode(self, encoded: bytes) -> pa.RecordBatch:
        reader = pa.ipc.open_stream(pa.py_buffer(encoded))
        batches = list(reader)
        if len(batches) == 1:
            return batches[0]
        table = pa.Table.from_batches(batches, schema=reader.schema)
        return table.combine_chunks().to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist(
            [], schema=reader.schema
        )

    def estimate_size(self, value: pa.RecordBatch) -> int:
        return value.nbytes

    def is_deterministic(self) -> bool:
        return True

    def to_type_hint(self):
        return pa.RecordBatch


def register_arrow_coder() -> None:
    """Make Beam use the Arrow coder for every PCollection typed ``pa.RecordBatch``."""
    beam.coders.registry.register_coder(pa.RecordBatch, ArrowRecordBatchCoder)


register_arrow_coder()
