"""The port counter table is the one definition: the config's defaults, the sample trees, the
docs' counter table and rule table, the dashboard's counter panels and the deploy configs that
spell the defaults out all agree with it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rdmaplane.adapters.discovery import samples
from rdmaplane.core.counters import (
    DEFAULT_FATAL_THRESHOLDS,
    DEFAULT_THRESHOLDS,
    HW,
    PMA,
    PORT_COUNTERS,
)
from rdmaplane.core.porthealth import PORT_RULES, FaultClass
from rdmaplane.core.settings.agent import AgentSettings

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts/counter-tables.py"


def test_the_table_holds_together() -> None:
    names = [c.name for c in PORT_COUNTERS]
    metrics = [c.metric for c in PORT_COUNTERS if c.metric]
    assert len(set(names)) == len(names) and len(set(metrics)) == len(metrics)
    for c in PORT_COUNTERS:
        assert c.directory in (PMA, HW), c.name
        assert (c.threshold is None) == (c.cls is None), c.name  # a default rule has a class
        assert c.panel is None or c.metric is not None, c.name  # a panel draws a metric
        assert c.help and not c.help.endswith("."), c.name


def test_the_config_defaults_come_from_the_table() -> None:
    config = AgentSettings()
    assert config.health.thresholds == DEFAULT_THRESHOLDS
    assert config.fault.fatal_thresholds == DEFAULT_FATAL_THRESHOLDS == {"link_downed": 0}
    assert DEFAULT_THRESHOLDS == {
        "link_downed": 0,
        "symbol_error": 100,
        "port_rcv_errors": 100,
        "local_ack_timeout_err": 100,
    }


def test_sample_trees_hold_every_counter_of_the_table(tmp_path: Path) -> None:
    """PMA counters per port; hw_counters device-wide on RoCE HCAs, none on InfiniBand ones."""
    spec = samples.load("hgx-h200-ib").spec  # InfiniBand compute, RoCE storage
    samples.build(spec, tmp_path)
    want = {d: {c.name for c in PORT_COUNTERS if c.directory == d} for d in (PMA, HW)}
    for hca in spec["hcas"]:
        base = (tmp_path / "class/infiniband" / hca["name"]).resolve()
        for n in range(1, len(hca.get("ports", [])) + 1):
            assert {p.name for p in (base / f"ports/{n}/counters").iterdir()} == want[PMA]
        ib = hca["ports"][0].get("link_layer") == "InfiniBand"
        found = {p.name for p in (base / "hw_counters").iterdir()} if not ib else set()
        assert found == (set() if ib else want[HW]), hca["name"]


def test_docs_and_dashboard_are_written_from_the_table() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("name", "edit"),
    [
        ("docs/agent.md", lambda t: t.replace("`rdmaplane_port_symbol_errors_total`", "`x`", 1)),
        (
            "deploy/grafana/rdmaplane-dashboard.json",
            lambda t: t.replace("rdmaplane_port_link_downed_total", "rdmaplane_port_x_total", 1),
        ),
    ],
)
def test_a_stale_file_is_found_and_rewritten(tmp_path: Path, name: str, edit) -> None:
    for rel in ("docs/agent.md", "deploy/grafana/rdmaplane-dashboard.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    (tmp_path / name).write_text(edit((tmp_path / name).read_text()))

    def run(*flags: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, str(SCRIPT), "--root", str(tmp_path), *flags]
        return subprocess.run(command, capture_output=True, text=True, check=False)

    stale = run("--check")
    assert (stale.returncode, stale.stdout.strip()) == (
        1,
        f"error: out of date, run scripts/counter-tables.py: {name}",
    )
    assert run().stdout.strip() == f"wrote {name}"
    assert (tmp_path / name).read_text() == (REPO / name).read_text()


def test_the_dashboard_draws_every_counter_with_a_default_threshold() -> None:
    text = (REPO / "deploy/grafana/rdmaplane-dashboard.json").read_text()
    drawn = set(re.findall(r"rdmaplane_port_([a-z_]+)_total", text))
    assert {c.metric for c in PORT_COUNTERS if c.threshold is not None} <= drawn
    assert drawn <= {c.metric for c in PORT_COUNTERS}


def test_the_docs_rule_table_says_what_the_rule_table_does() -> None:
    """docs/agent.md's rows of the rule table: each fixed row's reason, unhealthy and class."""
    text = (REPO / "docs/agent.md").read_text()
    rows = re.findall(r"^\s*\| `(\w+)` \| [^|]+ \| `[^`]+` \| (yes|no) \| (fatal) \|$", text, re.M)
    documented = [(reason, unhealthy == "yes", FaultClass(cls)) for reason, unhealthy, cls in rows]
    assert documented == [(r.reason, r.unhealthy, r.fault) for r in PORT_RULES]


def deploy_thresholds() -> dict[str, dict[str, int]]:
    """The health thresholds that deploy/agent and the Helm chart's values spell out."""
    daemonset = yaml.safe_load_all((REPO / "deploy/agent/daemonset.yaml").read_text())
    config_map = next(d for d in daemonset if d["kind"] == "ConfigMap")
    agent = yaml.safe_load(config_map["data"]["agent.yaml"])
    values = yaml.safe_load((REPO / "deploy/helm/rdmaplane/values.yaml").read_text())
    return {
        "deploy/agent/daemonset.yaml": agent["health"]["thresholds"],
        "deploy/helm/rdmaplane/values.yaml": values["agent"]["config"]["health"]["thresholds"],
    }


def test_deploy_configs_spell_out_the_default_thresholds() -> None:
    """They list the defaults so an operator sees them (and Helm merges overrides into them):
    they must be the table's."""
    for where, thresholds in deploy_thresholds().items():
        assert thresholds == DEFAULT_THRESHOLDS, where
