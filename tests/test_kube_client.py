"""Client construction in the kube adapter: which configuration it picks, and its errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rdmaplane.adapters.kube import KubeconfigError, load_config


def test_kubeconfig_file_is_used_when_given(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )

    config = load_config(kubeconfig).get()

    assert config is not None
    assert config.cluster.server == "https://127.0.0.1:6443"


def test_missing_kubeconfig_is_named(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError, match=r"kubeconfig .*nowhere does not exist"):
        load_config(tmp_path / "nowhere")


def test_without_kubeconfig_outside_a_pod_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    with pytest.raises(KubeconfigError, match="not running in a pod with a service account"):
        load_config(None)
