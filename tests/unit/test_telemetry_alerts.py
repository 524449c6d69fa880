"""examples/alerts.yml: well-formed Prometheus rules that fire on the combinations they encode."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ALERTS = Path(__file__).resolve().parents[2] / "examples" / "alerts.yml"
KNOWN_METRICS = (
    "interlock_queue_depth",
    "interlock_queue_oldest_wait_seconds",
    "interlock_admission_to_first_byte_seconds_bucket",
    "interlock_upstream_cooldown_active",
    "interlock_ledger_oldest_unknown_age_seconds",
    "interlock_ledger_oldest_accepted_age_seconds",
    "interlock_ledger_entries",
    "interlock_ledger_up",
    "interlock_telemetry_spans_dropped_total",
)

# promtool unit tests: synthetic series, one scenario per alert and one that must stay quiet.
PROMTOOL_TESTS = """
rule_files: [alerts.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # demand > service: depth and oldest age both rise
      - series: 'interlock_queue_depth{scope="global"}'
        values: '1+1x40'
      - series: 'interlock_queue_oldest_wait_seconds{scope="global"}'
        values: '1+2x40'
      # depth rises but the oldest call does not age: draining in order, no alert
      - series: 'interlock_queue_depth{scope="tenant:b"}'
        values: '1+1x40'
      - series: 'interlock_queue_oldest_wait_seconds{scope="tenant:b"}'
        values: '5x40'
    alert_rule_test:
      - eval_time: 5m
        alertname: InterlockDemandExceedsService
        exp_alerts: []
      - eval_time: 25m
        alertname: InterlockDemandExceedsService
        exp_alerts:
          - exp_labels: {severity: warning, scope: global}
            exp_annotations: {labels: {scope: global}}
  - interval: 1m
    input_series:
      # mail: fast (< 0.1 s) for 30 minutes, then every call takes ~0.5 s; its queue stays flat
      - series: 'interlock_admission_to_first_byte_seconds_bucket{upstream="mail",le="0.1"}'
        values: '0+60x30 1800x40'
      - series: 'interlock_admission_to_first_byte_seconds_bucket{upstream="mail",le="1"}'
        values: '0+60x70'
      - series: 'interlock_admission_to_first_byte_seconds_bucket{upstream="mail",le="+Inf"}'
        values: '0+60x70'
      - series: 'interlock_queue_depth{scope="upstream:mail"}'
        values: '3x70'
      # files: the same slowdown, but its queue grows: that is demand, not a slow dependency
      - series: 'interlock_admission_to_first_byte_seconds_bucket{upstream="files",le="0.1"}'
        values: '0+60x30 1800x40'
      - series: 'interlock_admission_to_first_byte_seconds_bucket{upstream="files",le="1"}'
        values: '0+60x70'
      - series: 'interlock_admission_to_first_byte_seconds_bucket{upstream="files",le="+Inf"}'
        values: '0+60x70'
      - series: 'interlock_queue_depth{scope="upstream:files"}'
        values: '0+2x70'
    alert_rule_test:
      - eval_time: 25m
        alertname: InterlockSlowDependency
        exp_alerts: []
      - eval_time: 50m
        alertname: InterlockSlowDependency
        exp_alerts:
          - exp_labels: {severity: warning, upstream: mail}
            exp_annotations: {labels: {upstream: mail}}
  - interval: 1m
    input_series:
      - series: 'interlock_ledger_oldest_unknown_age_seconds{instance="a"}'
        values: '0+60x20'
      - series: 'interlock_ledger_oldest_unknown_age_seconds{instance="b"}'
        values: '0+60x20'
    alert_rule_test:
      - eval_time: 9m
        alertname: InterlockReconciliationNeeded
        exp_alerts: []
      - eval_time: 12m
        alertname: InterlockReconciliationNeeded
        exp_alerts:
          - exp_labels: {severity: critical}
            exp_annotations: {value: "12m 0s"}
"""


def load_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_alerts_file_has_the_prometheus_rule_structure() -> None:
    """Every rule is an alert with an expression, a severity and a summary; names are unique."""
    document = yaml.safe_load(ALERTS.read_text())
    assert set(document) == {"groups"}
    names = [group["name"] for group in document["groups"]]
    assert len(names) == len(set(names))
    rules = load_rules()
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["expr"].strip()
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"]
    alerts = {rule["alert"] for rule in rules}
    assert len(alerts) == len(rules)
    assert {
        "InterlockDemandExceedsService",
        "InterlockSlowDependency",
        "InterlockReconciliationNeeded",
    } <= alerts


def test_alerts_use_only_metrics_interlock_exports() -> None:
    """Each metric an expression names is one `/metrics` serves (a rename would break alerts)."""
    text = "\n".join(rule["expr"] for rule in load_rules())
    named = {word for word in _identifiers(text) if word.startswith("interlock_")}
    assert named <= set(KNOWN_METRICS), named - set(KNOWN_METRICS)


def _with_annotations(tests_yaml: str) -> dict[str, Any]:
    """Fill each expected alert's annotations by rendering the rule's templates.

    In the test text, `exp_annotations` holds the template inputs (`labels`, `value`); promtool
    compares rendered annotations exactly, so they are rendered here the way Prometheus would.
    """
    templates = {rule["alert"]: rule["annotations"] for rule in load_rules()}
    document: dict[str, Any] = yaml.safe_load(tests_yaml)
    for case in document["tests"]:
        for check in case["alert_rule_test"]:
            for alert in check["exp_alerts"]:
                inputs = alert["exp_annotations"]
                alert["exp_annotations"] = {
                    key: _render(text, inputs.get("labels", {}), inputs.get("value", ""))
                    for key, text in templates[check["alertname"]].items()
                }
    return document


def _render(template: str, labels: dict[str, str], value: str) -> str:
    text = template.replace("{{ $value | humanizeDuration }}", value)
    for name, label in labels.items():
        text = text.replace(f"{{{{ $labels.{name} }}}}", label)
    assert "{{" not in text, f"untested template in: {text}"
    return text


def _identifiers(text: str) -> set[str]:
    word = ""
    words: set[str] = set()
    for ch in text + " ":
        if ch.isalnum() or ch == "_":
            word += ch
        else:
            words.add(word)
            word = ""
    return words


@pytest.mark.skipif(
    shutil.which("promtool") is None and os.environ.get("CI") != "true",
    reason="promtool is not installed (CI installs it and never skips this)",
)
def test_promtool_accepts_and_unit_tests_the_rules(tmp_path: Path) -> None:
    """`promtool check rules` passes and each alert fires on its scenario, not on its look-alike."""
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(_with_annotations(PROMTOOL_TESTS)))
    for command in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]):
        done = subprocess.run(
            ["promtool", *command], cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr
