"""docker-compose.yml: Interlock, PostgreSQL as ledger, Jaeger receiving OTLP; a valid config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from policies.config import parse_config_text

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))


def test_compose_runs_interlock_with_postgres_and_jaeger() -> None:
    """The three services exist; Interlock waits for a healthy PostgreSQL and is built here."""
    services = compose()["services"]
    assert {"interlock", "postgres", "jaeger"} <= set(services)
    interlock = services["interlock"]
    assert interlock["build"] == "."
    assert interlock["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    assert services["demo-upstream"]["network_mode"] == "service:interlock"


def test_compose_config_is_a_valid_interlock_config() -> None:
    """The embedded config parses, uses PostgreSQL, exports to Jaeger's OTLP/HTTP port."""
    text = compose()["configs"]["interlock_config"]["content"]
    config = parse_config_text(text, "docker-compose.yml", environ={})
    assert config.ledger.url.startswith("postgresql://")
    assert "@postgres:5432/" in config.ledger.url
    assert config.telemetry.otlp_endpoint == "http://jaeger:4318"
    assert config.listen_host == "0.0.0.0"
    assert f"EXPOSE {config.listen_port}" in (ROOT / "Dockerfile").read_text()


def test_prometheus_profile_loads_the_example_alerts() -> None:
    """With `--profile metrics`, Prometheus scrapes Interlock and evaluates examples/alerts.yml."""
    document = compose()
    prometheus = document["services"]["prometheus"]
    assert "./examples/alerts.yml:/etc/prometheus/alerts.yml:ro" in prometheus["volumes"]
    scrape = yaml.safe_load(document["configs"]["prometheus_config"]["content"])
    assert scrape["rule_files"] == ["/etc/prometheus/alerts.yml"]
    assert scrape["scrape_configs"][0]["static_configs"][0]["targets"] == ["interlock:8787"]


def test_compose_ships_no_guessable_admin_token() -> None:
    """The admin token must be set by whoever runs the stack: no default value to guess."""
    value = compose()["services"]["interlock"]["environment"]["INTERLOCK_ADMIN_TOKEN"]
    assert value.startswith("${INTERLOCK_ADMIN_TOKEN:?"), value
