"""A package of an optional extra that is not installed is a configuration error.

``collector: {backend: file, url: 's3://bucket/usage/'}`` without s3fs used to end in "internal error
(a bug ...): ImportError" (exit 70).  Each extra's module is made unimportable in a fresh
interpreter running the real CLI (``sys.modules[name] = None`` is what ``import name`` sees when
the package is absent; a subprocess, because this process has most of them imported already), and
the command must exit 2 with one line naming what asked for the package and the extra to install.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from hardening_support import configure, copied, one_line, one_sample

NOW = "2026-01-01T04:00:00Z"
#: The console script's code, with the module ``sys.argv[1]`` made unimportable first.
BLOCKED = ("import sys; sys.modules[sys.argv.pop(1)] = None; from ratebeam.pipelines.cli import main; "
           "sys.exit(main())")
KEYSTONE = {"url": "http://127.0.0.1:1/v3", "username": "u", "password": "p", "user_domain_name": "Default",
            "project_name": "service", "project_domain_name": "Default"}

#: (id, blocked module, extra, package, ratebeam.yaml sections, command, what the line must name)
CASES = [
    ("s3-collector", "s3fs", "s3", "s3fs", {"collector": {"backend": "file", "url": "s3://bucket/usage/"}},
     ("run", "--now", NOW), ("collector.url", "s3://bucket/usage/")),
    ("s3-parquet-storage", "s3fs", "s3", "s3fs",
     {"storage": {"backends": [{"backend": "parquet", "url": "s3://bucket/rated"}]}},
     ("run", "--now", NOW), ("parquet storage", "s3://bucket/rated")),
    ("postgresql", "psycopg", "postgresql", "psycopg", {"database_url": "postgresql://u@127.0.0.1:1/db"},
     ("db", "upgrade"), ("database", "postgresql://u@127.0.0.1:1/db")),
    ("cloudkitty-rpc", "oslo_messaging", "cloudkitty-rpc", "oslo.messaging", {},
     ("rpc", "--transport-url", "rabbit://127.0.0.1:1/"), ("rpc",)),
    ("openstack-keystone-fetcher", "keystoneauth1", "openstack", "keystoneauth1",
     {"fetcher": {"backend": "keystone", **KEYSTONE}}, ("run", "--now", NOW), ("fetcher", "keystone")),
    ("openstack-aetos-collector", "keystoneauth1", "openstack", "keystoneauth1",
     {"collector": {"backend": "aetos", "url": "http://127.0.0.1:1/api/v1", "keystone": KEYSTONE}},
     ("run", "--now", NOW), ("collector", "aetos")),
    ("openstack-gnocchi-collector", "keystoneauth1", "openstack", "keystoneauth1",
     {"collector": {"backend": "gnocchi", "keystone": KEYSTONE}, "metrics": "gnocchi-metrics.yml"},
     ("run", "--now", NOW), ("collector", "gnocchi")),
    ("service", "prometheus_client", "service", "prometheus-client", {},
     ("serve", "--metrics-port", "19100", "--ticks", "1"), ("--metrics-port",)),
    ("chart", "matplotlib", "chart", "matplotlib", {}, ("report", "chart", "--output", "costs.png"),
     ("report chart",)),
    ("dask", "distributed", "dask", "dask[distributed]", {},
     ("run", "--now", NOW, "--runner-config", "dask.yaml"), ("runner: DaskRunner",)),
    ("events", "kombu", "events", "kombu", {"events": {"source": {"transport_url": "rabbit://127.0.0.1:1/"}}},
     ("events", "serve"), ("events serve",)),
]


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    root = one_sample(tmp_path_factory.mktemp("extras") / "ws")
    (root / "gnocchi-metrics.yml").write_text(yaml.safe_dump({"metrics": {"cpu": {
        "unit": "instance", "groupby": ["id", "project_id"],
        "extra_args": {"aggregation_method": "mean", "resource_type": "instance"}}}}))
    return root


@pytest.mark.parametrize(("blocked", "extra", "package", "sections", "argv", "names"),
                         [pytest.param(*case[1:], id=case[0]) for case in CASES])
def test_a_missing_extra_is_refused_naming_the_key_and_the_extra(template, tmp_path, blocked, extra, package,
                                                                 sections, argv, names):
    ws = copied(template, tmp_path)
    configure(ws, **sections)
    done = subprocess.run([sys.executable, "-c", BLOCKED, blocked, *argv, "-c", str(ws / "ratebeam.yaml")],
                          cwd=ws, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    line = one_line(done.stderr)
    assert f"needs {package}, which is not installed" in line, line
    assert f"pip install 'ratebeam[{extra}]'" in line, line
    for name in names:
        assert name in line, (name, line)


def test_every_extra_of_pyproject_has_its_case():
    """A new extra (the Dask one) comes with its case here and its entry in ``connectors.extras``.

    Extras made only of ratebeam's own extras (``all``, the ``cloudkitty`` alias, ``test``'s
    first line) bring no package of their own; ``all`` names every runtime extra.
    """
    from ratebeam.connectors.extras import EXTRAS

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    bundles = {name for name, needs in extras.items() if all(need.startswith("ratebeam[") for need in needs)}
    assert bundles == {"all", "cloudkitty"}, bundles
    assert set(extras) - bundles - {"test"} == set(EXTRAS) == {c[2] for c in CASES}
    (everything,) = extras["all"]
    assert set(everything.removeprefix("ratebeam[").removesuffix("]").split(",")) == set(EXTRAS)
    assert extras["cloudkitty"] == ["ratebeam[cloudkitty-rpc]"]
