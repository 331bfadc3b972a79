"""Option checks shared by every HTTP connector's configuration (CA file, timeout).

One place, so a ``cafile`` or ``timeout`` mistake gets the same message whatever the backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ratebeam.pipelines.metrics_config import Where


def cafile_option(where: Where, raw: dict[str, Any], base: Path) -> str | None:
    """``cafile`` resolved against the config file's directory; it must exist (None if absent)."""
    if "cafile" not in raw:
        return None
    path = base / Path(where.key("cafile").string(raw["cafile"])).expanduser()
    if not path.is_file():
        raise where.key("cafile").error("no such file", str(path))
    return str(path)


def timeout_option(where: Where, raw: dict[str, Any], default: float = 60) -> float:
    """``timeout`` in seconds, in (0, 3600]."""
    timeout = raw.get("timeout", default)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 3600:
        raise where.key("timeout").error("expected a number of seconds in (0, 3600]", timeout)
    return float(timeout)
