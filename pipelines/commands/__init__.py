"""What each ``ratebeam`` sub-command does, one module per command group (the parser is ``pipelines.cli``).

``common`` holds what every group shares (argument parsing, tables, ``CommandError``); ``run``
rates (``run``, ``demo``, ``rate``), ``rules`` edits the rating setup (``db``, ``rules``,
``modules``, ``scripts``), ``hashmap`` edits the rules one at a time, ``state`` the scope states
and ``report`` reads rated data back.  Each handler takes the parsed ``argparse.Namespace`` and
returns the exit status; heavy modules (Beam, Polars, the storage backends) are imported inside the
handlers that need them, so importing these modules to build the parser costs nothing.
"""
