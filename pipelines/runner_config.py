"""Runner option files (``runner_configs/*.yaml``): which Beam runner, with which options.

A file is ``{runner: <name>, options: [--flag=value, ...]}``; it is validated here, at the edge,
so a typo gives one clear message instead of a Beam traceback.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ratebeam.pipelines.errors import InputError

RUNNERS = ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner", "FlinkRunner", "PortableRunner")


def load_runner_config(path: str | Path) -> tuple[str, list[str]]:
    """The runner name and its pipeline options from a runner config file."""
    source = str(path)
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(source, "", f"cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise InputError(source, "", f"not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise InputError(source, "", "must be a mapping with 'runner' and 'options'")
    unknown = sorted(set(raw) - {"runner", "options"})
    if unknown:
        raise InputError(source, unknown[0], "unknown key")
    runner = raw.get("runner")
    if runner not in RUNNERS:
        raise InputError(source, "runner", f"unknown runner (expected one of {', '.join(RUNNERS)})", runner)
    options = raw.get("options") or []
    if not isinstance(options, list) or not all(isinstance(o, str) and o.startswith("--") for o in options):
        raise InputError(source, "options", "must be a list of '--flag=value' strings", options)
    return runner, list(options)
