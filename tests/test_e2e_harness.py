"""The e2e harness's own logic that needs no cluster: the scheduler configuration pass-through."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.controlplane import scheduler_configuration

KUBECONFIG = Path("/tmp/scheduler.kubeconfig")


def test_given_configuration_passes_through_with_defaults_filled_in() -> None:
    extender = {"urlPrefix": "http://127.0.0.1:8888", "filterVerb": "filter", "weight": 5}
    given = {"extenders": [extender], "leaderElection": {"leaderElect": True}}

    result = scheduler_configuration(given, KUBECONFIG)

    assert result["extenders"] == [extender]
    assert result["leaderElection"] == {"leaderElect": True}
    assert result["clientConnection"] == {"kubeconfig": str(KUBECONFIG)}
    assert result["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert result["kind"] == "KubeSchedulerConfiguration"
    assert "clientConnection" not in given  # the caller's dict is left alone


def test_yaml_text_and_no_configuration_are_accepted() -> None:
    text = "apiVersion: kubescheduler.config.k8s.io/v1\nprofiles:\n- schedulerName: gpu\n"

    from_yaml = scheduler_configuration(text, KUBECONFIG)
    default = scheduler_configuration(None, KUBECONFIG)

    assert from_yaml["profiles"] == [{"schedulerName": "gpu"}]
    assert default["leaderElection"] == {"leaderElect": False}
    assert default["clientConnection"]["kubeconfig"] == str(KUBECONFIG)
