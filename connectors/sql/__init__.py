"""The SQL layer: CloudKitty-compatible tables, rules repository, scope state store, dead letters.

SQLAlchemy 2; a SQLite file by default, PostgreSQL in production.
"""
