"""The Alembic environment of ratebeam's schema.

There is no alembic.ini: :func:`ratebeam.connectors.sql.migrations.alembic_config` builds the
configuration in code and hands this script the connection to use, already inside the locked
transaction of ``upgrade`` (so Alembic opens no transaction of its own, and everything commits or
rolls back together).  Only online migrations exist: revision 0001 inspects the database (it adds
to an existing CloudKitty database only what is missing), which a ``--sql`` script cannot do.
"""

from __future__ import annotations

from alembic import context

from ratebeam.connectors.sql.migrations import VERSION_TABLE
from ratebeam.connectors.sql.models import Base

config = context.config
if context.is_offline_mode() or "connection" not in config.attributes:
    raise RuntimeError("ratebeam's migrations run online, on the connection given by migrations.alembic_config()")
connection = config.attributes["connection"]

context.configure(
    connection=connection,
    # The models, for `alembic revision --autogenerate` and the drift test; revisions name every
    # constraint themselves (op.f), so the models' naming convention cannot change an old revision.
    target_metadata=Base.metadata,
    # Not Alembic's default `alembic_version`, nor CloudKitty's `<tree>_alembic`: one database for both.
    version_table=VERSION_TABLE,
    # SQLite alters tables by rebuilding them; batch mode does that, and plain ALTERs elsewhere.
    render_as_batch=connection.dialect.name == "sqlite",
    on_version_apply=config.attributes.get("on_version_apply", ()),
)
with context.begin_transaction():
    context.run_migrations()
