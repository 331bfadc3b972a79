"""Runner option files (``runner_configs/*.yaml``): which Beam runner, with which options.

A file is ``{runner: <name>, options: [--flag=value, ...]}``; it is validated here, at the edge,
read like every other YAML file (a repeated key is refused), so a typo gives one clear message
instead of a Beam traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, StringConstraints

from ratebeam.connectors.config_model import ConfigModel, Invalid, choice
from ratebeam.pipelines.validation import validate
from ratebeam.pipelines.yaml_loader import read_yaml

RUNNERS = ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner", "FlinkRunner", "PortableRunner")


def _flags(value: Any) -> tuple[str, ...]:
    options = value or []
    if not isinstance(options, list) or not all(isinstance(o, str) and o.startswith("--") for o in options):
        raise Invalid("must be a list of '--flag=value' strings")
    return tuple(options)


class RunnerConfig(ConfigModel):
    """One runner config file."""

    runner: choice(RUNNERS, ", ".join(RUNNERS))
    options: Annotated[tuple[Annotated[str, StringConstraints(pattern=r"^--")], ...], BeforeValidator(_flags)] = ()


def load_runner_config(path: str | Path) -> tuple[str, list[str]]:
    """The runner name and its pipeline options from a runner config file."""
    source = str(path)
    config = validate(RunnerConfig, read_yaml(path, source), source)
    return config.runner, list(config.options)
