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
        """The batch as one IPC stream: its schema (with the manifest metadata), then the batch."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, value.schema) as writer:
            writer.write_batch(value)
        return sink.getvalue().to_pybytes()

    def decode(self, encoded: bytes) -> pa.RecordBatch:
        """The batch back from its IPC stream (several batches are combined into one)."""
        reader = pa.ipc.open_stream(pa.py_buffer(encoded))
        batches = list(reader)
        if len(batches) == 1:
            return batches[0]
        table = pa.Table.from_batches(batches, schema=reader.schema)
        return table.combine_chunks().to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist(
            [], schema=reader.schema
        )

    def estimate_size(self, value: pa.RecordBatch) -> int:
        """The batch's buffer size, without encoding it (Beam samples sizes inside fused stages).

        The size of the buffers it refers to: a slice counts its parent's (``nbytes``, exact for a
        slice, cannot measure a slice of string views, the layout Polars shares without copying).
        """
        return value.get_total_buffer_size()

    def is_deterministic(self) -> bool:
        """True: equal batches give equal bytes, so Beam may use the coder for keys."""
        return True

    def to_type_hint(self) -> type[pa.RecordBatch]:
        """The Python type this coder encodes."""
        return pa.RecordBatch


def register_arrow_coder() -> None:
    """Make Beam use the Arrow coder for every PCollection typed ``pa.RecordBatch``."""
    beam.coders.registry.register_coder(pa.RecordBatch, ArrowRecordBatchCoder)


register_arrow_coder()
