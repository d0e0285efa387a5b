"""deploy/agent/own-node.yaml names what the agent writes, as the code names it: the policy is a
second spelling of those names, so they are checked against the code's (the behaviour on the
real API server: tests/e2e/test_own_node.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from rdmaplane.core import faults, notice, nrt
from rdmaplane.core.fabric import DEFAULT_TIER_LABELS
from rdmaplane.services.agent.policy.desired import ANNOTATION_TOPOLOGY, LABELS

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PREFIX = "rdmaplane.io/"


def _policies() -> dict[str, dict[str, Any]]:
    docs = yaml.safe_load_all((DEPLOY / "agent" / "own-node.yaml").read_text())
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}


def _variable(policy: dict[str, Any], name: str) -> str:
    return next(str(v["expression"]) for v in policy["spec"]["variables"] if v["name"] == name)


def test_the_policy_lets_through_every_name_the_agent_writes() -> None:
    policy = _policies()["rdmaplane-agent-own-node"]
    text = yaml.safe_dump(policy)
    tiers = re.findall(r"'([^']+)'", _variable(policy, "tierLabels"))
    assert tiers == list(DEFAULT_TIER_LABELS)
    assert f"startsWith('{PREFIX}')" in text
    assert all(
        name.startswith(PREFIX) for name in (*LABELS, ANNOTATION_TOPOLOGY, notice.ANNOTATION)
    )
    assert f"'{nrt.CONDITION_RDMA_READY}'" in text and f"'{faults.CONDITION}'" in text
    assert f"'{faults.TAINT_KEY}'" in text


def test_both_policies_bind_the_service_accounts_of_both_daemonsets() -> None:
    users = set()
    for path in ("agent/daemonset.yaml", "dra/daemonset.yaml"):
        ds = next(
            d for d in yaml.safe_load_all((DEPLOY / path).read_text()) if d["kind"] == "DaemonSet"
        )
        account = ds["spec"]["template"]["spec"]["serviceAccountName"]
        users.add(f"system:serviceaccount:{ds['metadata']['namespace']}:{account}")
    for name, policy in _policies().items():
        condition = policy["spec"]["matchConditions"][0]["expression"]
        assert set(re.findall(r"'(system:serviceaccount:[^']+)'", condition)) == users, name
