"""Everything around one pipeline run on a runner: its configuration and the processes it needs.

``config`` is the runner-config file's model (``runner_configs/*.yaml``), ``launch`` starts what a
run needs (Prism, a pool of SDK workers, a Dask cluster) and stops it afterwards, ``dask_runner``
is ratebeam's translation of Beam's DaskRunner, ``sdk_worker`` the Python SDK worker started for
Prism, ``tethered`` the child processes that die with their parent.  Nothing is imported here.
"""
