"""connectors/storage."""
