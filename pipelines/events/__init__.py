"""The event stream's job, one module per step (``docs/events.md``).

``graph`` builds the job: ``source`` (the bus into the SQL inbox, the inbox into the job) →
``match`` (event definitions and triggers) → ``scope`` (trigger instances in state, timers,
lifecycle usage, frames) → rating and the writers; ``job`` holds what every step shares, ``config``
the ``events:`` section of ``ratebeam.yaml``, ``serve`` the long-running command's loop and
``replay`` the reprocessing of a past range; ``data/`` the shipped definitions and triggers.
Nothing is imported here, so reading the configuration does not import Beam.
"""
