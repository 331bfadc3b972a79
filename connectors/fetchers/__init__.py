"""connectors/fetchers."""
