"""deploy/kubernetes, rendered by kustomize and validated offline against Kubernetes 1.33's schemas.

``kustomize build`` (tests/servers/kustomize_install.sh builds it from the Go module proxy) renders
the base and each overlay; every built-in resource is checked by ``kubernetes-validate`` in strict
mode (unknown fields refused) against :data:`KUBERNETES`.  The two custom resources (the Prometheus
Operator's ServiceMonitor, the Dask operator's DaskCluster) have no schema there: their CRDs are
not bundled, so they are checked for their kind and API group only, and said so here.
The ConfigMap's ``ratebeam.yaml`` is loaded by ``ratebeam config check`` with the secrets as files,
as a pod would load it, and every workload's probes, requests and stop grace are checked.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from pipeline_support import ratebeam
from servers import installed, unavailable

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy" / "kubernetes"
#: The Kubernetes version the manifests are validated against (schemas bundled by kubernetes-validate).
KUBERNETES = "1.33.0"
TREES = ["base", "overlays/production", "overlays/cron", "overlays/dask", "overlays/openstack-helm"]
#: Custom resources: (apiVersion, kind) whose CRD schemas kubernetes-validate does not bundle.
CUSTOM = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("kubernetes.dask.org/v1", "DaskCluster")}


def kustomize() -> str:
    binary = installed("kustomize/v5.5.0/kustomize") or shutil.which("kustomize")
    if binary is None:
        unavailable("kustomize not built: run tests/servers/kustomize_install.sh")
    return binary


def render(tree: str) -> list[dict]:
    done = subprocess.run([kustomize(), "build", str(DEPLOY / tree)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.mark.parametrize("tree", TREES)
def test_every_rendered_resource_is_valid_kubernetes(tree):
    docs = render(tree)
    custom = set()
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CUSTOM:
            custom.add((doc["apiVersion"], doc["kind"]))
            continue
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    expected = {"overlays/production": {("monitoring.coreos.com/v1", "ServiceMonitor")},
                "overlays/dask": {("kubernetes.dask.org/v1", "DaskCluster")}}.get(tree, set())
    assert custom == expected


def test_the_validator_refuses_a_wrong_field():
    """The check above can fail: a misspelt probe field is refused in strict mode."""
    deployment = next(d for d in render("base") if d["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGett"] = {"path": "/"}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


def workloads(docs: list[dict]) -> dict[str, dict]:
    """Each Deployment's, Job's and CronJob's pod spec, by name."""
    out = {}
    for doc in docs:
        spec = doc.get("spec", {})
        if doc["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        if doc["kind"] in ("Deployment", "Job", "CronJob"):
            out[doc["metadata"]["name"]] = {**spec["template"]["spec"], "_replicas": spec.get("replicas"),
                                            "_annotations": spec["template"].get("metadata", {}).get("annotations", {})}
    return out


def test_services_probe_their_health_endpoints_and_request_measured_memory():
    pods = workloads(render("base"))
    assert set(pods) == {"ratebeam-serve", "ratebeam-events", "ratebeam-rpc", "ratebeam-db-upgrade-0-1-0"}
    for name in ("ratebeam-serve", "ratebeam-events", "ratebeam-rpc"):
        (container,) = pods[name]["containers"]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz/live"
        assert container["readinessProbe"]["httpGet"]["path"] == "/healthz/ready"
        assert container["args"][-2:] == ["--metrics-port", "9464"]
        assert pods[name]["_annotations"]["prometheus.io/port"] == "9464"
        assert container["resources"]["requests"]["memory"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["RATEBEAM_DATABASE_URL_FILE"] == "/run/secrets/ratebeam/database_url"
    assert pods["ratebeam-serve"]["containers"][0]["resources"]["requests"]["memory"] == "1200Mi"
    assert pods["ratebeam-serve"]["_replicas"] == 2 and pods["ratebeam-events"]["_replicas"] == 1
    # serve's grace outlives lease_seconds (60): SIGTERM lets the current tick commit.
    assert pods["ratebeam-serve"]["terminationGracePeriodSeconds"] > 60
    cron = workloads(render("overlays/cron"))
    assert "ratebeam-serve" not in cron and cron["ratebeam-run"]["containers"][0]["args"][0] == "run"


def test_the_configmaps_ratebeam_yaml_loads_with_its_secrets_as_files(tmp_path):
    """The ConfigMaps' files where the pod has them (here a temporary /etc/ratebeam), the Secret's
    keys as files; the absolute paths of the pod are moved here by environment variables."""
    docs = render("base")
    etc, secrets = tmp_path / "etc", tmp_path / "secrets"
    (etc / "events").mkdir(parents=True)
    secrets.mkdir()
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            into = etc / "events" if doc["metadata"]["name"].startswith("ratebeam-event-definitions") else etc
            for name, text in doc["data"].items():
                (into / name).write_text(text)
    for name, value in {"database_url": f"sqlite:///{tmp_path / 'rb.db'}", "keystone_password": "ks-secret",
                        "influxdb_password": "influx-secret", "transport_url": "rabbit://rb:mq-secret@rabbit:5672/"}.items():
        (secrets / name).write_text(value + "\n")
    env = {
        "RATEBEAM_DATABASE_URL_FILE": str(secrets / "database_url"),
        "RATEBEAM_FETCHER__PASSWORD_FILE": str(secrets / "keystone_password"),
        "RATEBEAM_COLLECTOR__KEYSTONE__PASSWORD_FILE": str(secrets / "keystone_password"),
        "RATEBEAM_STORAGE__BACKENDS__0__PASSWORD_FILE": str(secrets / "influxdb_password"),
        "RATEBEAM_EVENTS__SOURCE__TRANSPORT_URL_FILE": str(secrets / "transport_url"),
        "RATEBEAM_EVENTS__DEFINITIONS": str(etc / "events" / "event_definitions.yaml"),
        "RATEBEAM_EVENTS__TRIGGERS": str(etc / "events" / "triggers.yaml"),
    }
    done = ratebeam("config", "check", "-c", str(etc / "ratebeam.yaml"), "--runner-config", str(etc / "prism.yaml"),
                    "--json", env=env)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    for secret in ("ks-secret", "influx-secret", "mq-secret"):
        assert secret not in done.stdout
    assert out["keys"]["fetcher.password"]["value"] == "***"
    assert out["keys"]["events.source.transport_url"]["value"] == "rabbit://rb:***@rabbit:5672/"
    assert out["loaded"][-1] == "loaded runner config: runner PortableRunner"


def test_the_configmaps_copies_are_the_shipped_files():
    """The ConfigMaps are seeded with the package's event files and the Keystone + Gnocchi example's
    metrics.yml (kustomize reads no file outside its tree): they must not drift from them."""
    config = DEPLOY / "base" / "config"
    assert (config / "metrics.yml").read_text() == (REPO / "docs/examples/keystone-gnocchi/metrics.yml").read_text()
    for name in ("event_definitions.yaml", "triggers.yaml"):
        assert (config / "events" / name).read_text() == (REPO / "pipelines/events/data" / name).read_text()
