"""ratebeam's schema revisions, one file each, named ``<revision id>_<what it does>.py``."""
