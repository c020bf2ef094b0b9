"""The operator-facing deploy assets: systemd units, Prometheus alert rules, the Grafana dashboard.

* ``deploy/systemd``: ``systemd-analyze verify`` accepts both units with nothing to say (it reports
  unknown keys and bad values as warnings with exit 0, so any output fails), each carries the hardening
  the docs promise, and ``systemd-analyze security --offline`` rates both "OK" or better.
* ``deploy/prometheus``: ``promtool check rules`` and the rule unit tests (``promtool test rules``).
* ``deploy/grafana``: every dashboard query parses (``promtool check rules`` on the queries as recording
  rules), and every metric a query or an alert names exists in the server's (or operator's) metrics.

systemd-analyze and promtool come from Debian's ``systemd`` and ``prometheus`` packages (.ci/run installs
them). Where a tool is missing the test is skipped, except under CI, where it fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from nstance.operator.health import OperatorMetrics
from nstance.server.state.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "deploy" / "systemd"
RULES = ROOT / "deploy" / "prometheus" / "nstance-alerts.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "nstance-alerts.test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "nstance-dashboard.json"
UNITS = ("nstance-server.service", "nstance-agent.service")
HARDENING = (
    "NoNewPrivileges=yes",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "PrivateTmp=yes",
    "CapabilityBoundingSet=",
    "RestrictSUIDSGID=yes",
    "SystemCallFilter=@system-service",
)
METRIC = re.compile(r"\bnstance_[a-z0-9_]+\b")
MAX_EXPOSURE = 2.5


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed; .ci/run installs it")
        pytest.skip(f"{name} is not installed (Debian: .ci/run installs it)")
    return path


def _units_runnable_here(tmp_path: Path) -> list[Path]:
    """The units with ExecStart pointing at this checkout's programs (verify checks that it exists)."""
    venv_bin = ROOT / ".venv" / "bin"
    out = []
    for name in UNITS:
        text = (SYSTEMD / name).read_text(encoding="utf-8").replace("/opt/nstance/bin/", f"{venv_bin}/")
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        out.append(path)
    return out


# --- systemd --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", UNITS)
def test_units_are_hardened_and_restart(name: str) -> None:
    lines = {line.strip() for line in (SYSTEMD / name).read_text(encoding="utf-8").splitlines()}
    missing = [setting for setting in HARDENING if setting not in lines]
    assert not missing, f"{name} lacks {missing}"
    assert any(line.startswith("User=nstance") for line in lines)
    assert any(line.startswith("EnvironmentFile=/etc/nstance/") for line in lines)
    assert any(line.startswith("Restart=") for line in lines)
    assert "RestartPreventExitStatus=2" in lines  # a bad flag is not retried forever
    users = (SYSTEMD / "nstance.sysusers.conf").read_text(encoding="utf-8")
    user = next(line.split("=", 1)[1] for line in lines if line.startswith("User="))
    assert re.search(rf"^u {re.escape(user)} ", users, re.MULTILINE), (
        f"{user} is not in nstance.sysusers.conf"
    )


def test_systemd_analyze_verify_is_silent(tmp_path: Path) -> None:
    tool = _tool("systemd-analyze")
    units = _units_runnable_here(tmp_path)
    result = subprocess.run(
        [tool, "verify", "--man=no", *map(str, units)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


def test_systemd_analyze_verify_would_catch_a_typo(tmp_path: Path) -> None:
    tool = _tool("systemd-analyze")
    (unit,) = [u for u in _units_runnable_here(tmp_path) if u.name == UNITS[0]]
    unit.write_text(unit.read_text().replace("ProtectSystem=strict", "ProtectSystem=strickt"))
    result = subprocess.run(
        [tool, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=120
    )
    assert "strickt" in result.stdout + result.stderr


@pytest.mark.parametrize("name", UNITS)
def test_systemd_security_exposure_is_low(tmp_path: Path, name: str) -> None:
    tool = _tool("systemd-analyze")
    (unit,) = [u for u in _units_runnable_here(tmp_path) if u.name == name]
    result = subprocess.run(
        [tool, "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout + result.stderr)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


# --- Prometheus -----------------------------------------------------------------------------------


def test_promtool_checks_the_rules() -> None:
    tool = _tool("promtool")
    result = subprocess.run([tool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rule_unit_tests_pass() -> None:
    tool = _tool("promtool")
    result = subprocess.run(
        [tool, "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=RULE_TESTS.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_unit_test() -> None:
    alerts = {
        rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    }
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert alerts == tested


# --- Grafana and metric names ---------------------------------------------------------------------


def _dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def _alert_queries() -> list[str]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [str(rule["expr"]) for group in groups for rule in group["rules"]]


def _sample_names(registry: CollectorRegistry) -> set[str]:
    names: set[str] = set()
    for family in registry.collect():
        if family.type == "counter":
            names |= {f"{family.name}_total", f"{family.name}_created"}
        elif family.type == "histogram":
            names |= {f"{family.name}_{suffix}" for suffix in ("bucket", "count", "sum", "created")}
        else:
            names.add(family.name)
    return names


def test_dashboard_covers_what_operators_watch() -> None:
    titles = " ".join(panel["title"].lower() for panel in json.loads(DASHBOARD.read_text())["panels"])
    for topic in (
        "shard",
        "groups",
        "instances",
        "creates",
        "replacements",
        "registrations",
        "leader changes",
    ):
        assert topic in titles, topic
    assert "load balancers" in titles


def test_every_queried_metric_exists() -> None:
    known = _sample_names(Metrics().registry) | _sample_names(OperatorMetrics().registry)
    queried = {name for query in _dashboard_queries() + _alert_queries() for name in METRIC.findall(query)}
    assert queried, "no metric found in the queries"
    unknown = sorted(queried - known)
    assert not unknown, f"queried but not exported: {unknown}"


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    tool = _tool("promtool")
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query{i}", "expr": query.replace("$__rate_interval", "5m")}
                    for i, query in enumerate(_dashboard_queries())
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    result = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
