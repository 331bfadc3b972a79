"""ratebeam's Alembic environment (``env.py``) and revisions (``versions/``), run by ``migrations.py``."""
