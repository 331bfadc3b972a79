"""The SQL layer: CloudKitty-compatible tables, the rules repository, the scope state store and the
dead letters (SQLAlchemy 2; a SQLite file by default, PostgreSQL in production)."""
