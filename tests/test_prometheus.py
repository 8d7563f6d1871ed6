"""Observability for real: Debian's Prometheus, with docker/prometheus.yml pointed at a running sim job's
controller, scrapes it, and the seed's metrics come back through Prometheus's HTTP API; the Grafana
dashboard queries only metrics the exporter really exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench.live_run import wait_for
from shared.names import RunStatus
from shared.runtime import free_port
from tests.live_run import live_run

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS = shutil.which("prometheus")
SCRAPED = ("dynamic_resource_mq_size", "dynamic_resource_resource_utilization",
           "dynamic_resource_rollout_resource_utilization", "dynamic_resource_train_resource_utilization")
PROMQL_WORDS = {"rate", "irate", "increase", "sum", "avg", "max", "min", "by", "without", "on", "ignoring",
                "delta", "deriv", "avg_over_time", "max_over_time", "min_over_time", "clamp_min", "abs"}
pytestmark = [pytest.mark.e2e, pytest.mark.prometheus,
              pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus is not installed "
                                 "(make system-deps installs it)")]


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Any]:
    """start(target) runs Prometheus on docker/prometheus.yml, its target replaced by `target` and its
    interval shortened to 1 s; returns the HTTP API's base URL. Stopped at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(target: str) -> str:
        config = yaml.safe_load((ROOT / "docker" / "prometheus.yml").read_text())
        config["global"]["scrape_interval"] = "1s"
        job = next(j for j in config["scrape_configs"] if j["job_name"] == "dynsched-controller")
        job["static_configs"] = [{"targets": [target]}]
        (tmp_path / "admin_token").write_text("prometheus-token\n")  # compose mounts the real one
        job["authorization"] = {"credentials_file": str(tmp_path / "admin_token")}
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        assert PROMETHEUS is not None
        with (tmp_path / "prometheus.log").open("wb") as log:
            procs.append(subprocess.Popen(
                [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                stdout=log, stderr=subprocess.STDOUT))
        return f"http://127.0.0.1:{port}"

    try:
        yield start
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def query(base_url: str, promql: str) -> list[dict[str, Any]]:
    """The instant vector Prometheus returns for `promql` ([] while it has none, or is not up yet)."""
    try:
        response = httpx.get(f"{base_url}/api/v1/query", params={"query": promql}, timeout=5)
    except httpx.HTTPError:
        return []
    if response.status_code == 503:  # Prometheus answers 503 until its storage is ready
        return []
    body = response.json()
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords or labels."""
    expr = re.sub(r'\{[^}]*\}|\[[^\]]*\]|"[^"]*"', "", expr)
    return {name for name in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr) if name not in PROMQL_WORDS}


def exported_names(metrics_text: str) -> set[str]:
    lines = [line for line in metrics_text.splitlines() if line and not line.startswith("#")]
    return {line.split()[0].split("{")[0] for line in lines}


def dashboard_exprs() -> list[tuple[str, str]]:
    dashboard = json.loads((ROOT / "docker" / "grafana" / "dashboards" / "dynsched.json").read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


@pytest.mark.timeout(240)
def test_prometheus_scrapes_a_running_controller_and_answers_mq_size_and_the_utilizations(
        tmp_path: Path, prometheus: Any) -> None:
    with live_run(tmp_path, time_scale=0.06) as (job, address):
        base_url = prometheus(address)
        for name in SCRAPED:
            result = wait_for(lambda name=name: query(base_url, name), timeout_s=120,
                              what=f"{name} in Prometheus", job=job)
            assert result[0]["metric"]["job"] == "dynsched-controller"
            assert float(result[0]["value"][1]) >= 0.0
        utilization = float(query(base_url, "dynamic_resource_resource_utilization")[0]["value"][1])
        assert 0.0 < utilization <= 1.0
        targets = httpx.get(f"{base_url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        assert [t["health"] for t in targets] == ["up"]
        wait_for(lambda: job.poll() == RunStatus.DONE, timeout_s=120, what="the run to finish", job=job)
        exported = exported_names(httpx.get(f"http://{address}/metrics", timeout=5).text)
    missing = [(title, expr, sorted(metric_names(expr) - exported)) for title, expr in dashboard_exprs()
               if metric_names(expr) - exported]
    assert not missing, f"Grafana panels query metrics the exporter does not export: {missing}"


def test_every_grafana_panel_has_a_query_and_the_dashboard_is_provisioned_in_compose() -> None:
    exprs = dashboard_exprs()
    assert exprs and all(metric_names(expr) for _, expr in exprs)
    titles = {title for title, _ in exprs}
    for figure in ("mq_size", "utilization", "activations", "Switch timings", "Reward"):
        assert any(figure.lower() in title.lower() for title in titles), figure
    grafana = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["grafana"]
    assert "./docker/grafana/dashboards:/var/lib/grafana/dashboards:ro" in grafana["volumes"]
