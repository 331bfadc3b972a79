"""Build a database with CloudKitty 25.0.0's own migrations (run by CloudKitty's venv's Python).

``python ck_dbsync.py URL`` runs what ``cloudkitty-dbsync upgrade`` runs (core and every rating
module: hashmap, pyscripts), then the storage-state tree that ``cloudkitty-storage-init``
migrates (without its storage back-end init, which needs an InfluxDB).  CloudKitty 25.0.0's
migrations have bugs worked around here, none changing the schema they build:

* SQLite: hashmap migration ``8a591f85865f`` updates rows through a second session while its DDL
  is still uncommitted on the first connection, so every thread must reuse one connection
  (``SingletonThreadPool``), as an in-memory database would;
* PostgreSQL: the rating modules' trees cannot run at all (hashmap ``f8c799db4aa0`` passes a plain
  string to ``Connection.execute``, which SQLAlchemy 2 refuses while oslo.db 18 needs SQLAlchemy
  >= 2.0.5; a later one adds a ``TEXT(256)`` column, which PostgreSQL refuses), so only the core
  and storage-state trees run there.
"""

import sys
import warnings

warnings.filterwarnings("ignore")

import sqlalchemy  # noqa: E402
from sqlalchemy.pool import SingletonThreadPool  # noqa: E402

_create_engine = sqlalchemy.create_engine


def _one_connection_per_thread(url, *args, **kwargs):
    if str(url).startswith("sqlite"):
        for pool_option in ("pool_size", "max_overflow", "pool_timeout"):
            kwargs.pop(pool_option, None)
        kwargs["poolclass"] = SingletonThreadPool
    return _create_engine(url, *args, **kwargs)


sqlalchemy.create_engine = _one_connection_per_thread

import cloudkitty.config  # noqa: E402, F401  (registers CloudKitty's options)
from oslo_config import cfg  # noqa: E402
from oslo_db import options  # noqa: E402

url = sys.argv[1]
options.set_defaults(cfg.CONF, connection=url)
if url.startswith("sqlite"):
    from cloudkitty.cli import dbsync

    sys.argv = ["cloudkitty-dbsync", "upgrade"]
    dbsync.main()
else:
    cfg.CONF([], project="cloudkitty", default_config_files=[])
    from cloudkitty.db import api

    api.get_instance().get_migration().upgrade("head")

from cloudkitty.storage_state import migration  # noqa: E402

migration.upgrade("head")
