"""connectors/sql."""
