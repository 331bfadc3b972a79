"""connectors/collectors."""
