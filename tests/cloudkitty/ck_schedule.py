"""Insert a reprocessing schedule with CloudKitty 25.0.0's own code, as ``POST /v2/task/reprocesses`` does.

Run in CloudKitty's venv: ``ck_schedule.py DATABASE_URL SCOPE START END REASON``.  The row is made
by CloudKitty's model and session (``storage_state.ReprocessingSchedulerDb.persist``) from bounds
parsed as its API parses them (``tzutils.dt_from_iso(..., as_utc=True)``), after the API's checks.
"""

import sys

from cloudkitty import storage_state
from cloudkitty.storage_state.models import ReprocessingScheduler
from cloudkitty.utils import tz as tzutils
from oslo_config import cfg
from oslo_db import options as db_options

url, scope, start, end, reason = sys.argv[1:6]
db_options.set_defaults(cfg.CONF, connection=url)
cfg.CONF([], project="cloudkitty", default_config_files=[])
storage_state.ReprocessingSchedulerDb().persist(ReprocessingScheduler(
    identifier=scope, reason=reason,
    start_reprocess_time=tzutils.dt_from_iso(start, as_utc=True),
    end_reprocess_time=tzutils.dt_from_iso(end, as_utc=True)))
