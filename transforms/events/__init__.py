"""Event-driven usage (seed 002): notifications → events → trigger instances → usage rows, all pure."""
