"""The device plugin's config file: native shape, the shared RDMA plugin's shape, and errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rdmaplane.adapters.config import API_VERSION, ConfigError, load, parse
from rdmaplane.adapters.config.deviceplugin import DEVICE_PLUGIN_CONFIG
from rdmaplane.cli import app
from rdmaplane.core.settings.deviceplugin import PluginSettings

HEAD = {"apiVersion": API_VERSION, "kind": "DevicePluginConfig"}


def parse_config(doc: object, source: str = "config") -> PluginSettings:
    """A native document (apiVersion and kind added) or a configList one, as a file says it."""
    if isinstance(doc, dict) and "configList" not in doc:
        doc = {**HEAD, **doc}
    return parse(doc, DEVICE_PLUGIN_CONFIG, source)


def load_config(path: Path) -> PluginSettings:
    return load(path, DEVICE_PLUGIN_CONFIG)


LEGACY = {
    "periodicUpdateInterval": 300,
    "configList": [
        {
            "resourceName": "hca_shared_devices_a",
            "resourcePrefix": "rdma",
            "rdmaHcaMax": 1000,
            "selectors": {
                "vendors": ["15b3"],
                "deviceIDs": ["1017"],
                "drivers": ["mlx5_core"],
                "ifNames": ["ens1f0"],
                "linkTypes": ["ether"],
            },
        },
        {"resourceName": "hca_shared_devices_b", "rdmaHcaMax": 500, "devices": ["ib0", "ib1"]},
    ],
}


def test_defaults_to_one_exclusive_pool() -> None:
    cfg = parse_config({})
    assert [(p.resource_name, p.mode) for p in cfg.pools] == [("rdmaplane.io/hca", "exclusive")]
    assert cfg.registration == "kubelet" and not cfg.cdi.enabled


def test_shared_mode_gets_its_own_default_name() -> None:
    cfg = parse_config({"pools": [{"mode": "shared", "slots": 8}]})
    assert (cfg.pools[0].resource_name, cfg.pools[0].slots) == ("rdmaplane.io/hca-shared", 8)


def test_reads_the_shared_rdma_plugin_config() -> None:
    cfg = parse_config(LEGACY)
    a, b = cfg.pools
    assert (a.resource_name, a.mode, a.slots) == ("rdma/hca_shared_devices_a", "shared", 1000)
    assert a.selectors.vendors == ("15b3",) and a.selectors.device_ids == ("1017",)
    assert a.selectors.drivers == ("mlx5_core",) and a.selectors.link_types == ("ether",)
    assert a.selectors.if_names == ("ens1f0",)
    assert (b.resource_name, b.slots, b.selectors.if_names) == (
        "rdma/hca_shared_devices_b",
        500,
        ("ib0", "ib1"),
    )
    assert cfg.health_poll_interval == 300


def test_native_nccl_settings_reach_the_plan() -> None:
    cfg = parse_config(
        {"pools": [{"nccl": {"socketIfname": "eth0", "trafficClass": 106, "serviceLevel": 3}}]}
    )
    settings = cfg.pools[0].nccl
    assert (settings.socket_ifname, settings.ib_tc, settings.ib_sl) == ("eth0", 106, 3)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"pools": [{"mode": "exclusiv"}]}, "pools[0].mode: Input should be 'exclusive' or"),
        (
            {"pools": [{"selectors": {"vendor": ["15b3"]}}]},
            "pools[0].selectors.vendor: unknown key (did you mean vendors?)",
        ),
        (
            {"pools": [{"selectors": {"linkTypes": ["fddi"]}}]},
            "pools[0].selectors.linkTypes: 'fddi' is not one of",
        ),
        (
            {"pools": [{"resourceName": "hca"}]},
            "pools[0].resourceName: 'hca' is not an extended resource name",
        ),
        ({"pools": [{}, {}]}, "pools: resourceName 'rdmaplane.io/hca' is used by more than one"),
        (
            {"healthPollInterval": 0},
            "healthPollInterval: Input should be greater than 0",
        ),
        ({"healthPollInterval": "5 seconds"}, "healthPollInterval: '5 seconds' is not a duration"),
        ({"resendIntervalSeconds": 5}, "unknown key (did you mean resendInterval?)"),
        ({"pools": [{"nccl": {"serviceLevel": 16}}]}, "pools[0].nccl.serviceLevel"),
        (
            {"pools": [{"nccl": {"ncclVersion": "latest"}}]},
            "pools[0].nccl.ncclVersion: 'latest' is not a version like 2.21",
        ),
        ({"configList": [{"resourceName": "a"}]}, "configList[0].rdmaHcaMax: Field required"),
        ({"configList": [{"resourceName": "a", "rdmaHcaMax": 0}]}, "configList[0].rdmaHcaMax"),
        ([1, 2], "expected a mapping with apiVersion and kind, got a list"),
        ({"configList": []}, "configList: List should have at least 1 item"),
    ],
)
def test_errors_name_the_bad_key(doc: object, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(doc, "dp.yaml")
    assert str(e.value).startswith("dp.yaml: ")
    assert message in str(e.value)


def test_loads_yaml_and_json_files(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(LEGACY))
    (tmp_path / "b.yaml").write_text(
        f"apiVersion: {API_VERSION}\nkind: DevicePluginConfig\npools:\n- mode: shared\n  slots: 4\n"
    )
    assert load_config(tmp_path / "a.json").pools[0].slots == 1000
    assert load_config(tmp_path / "b.yaml").pools[0].slots == 4
    (tmp_path / "c.yaml").write_text("pools: [\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: not valid YAML/JSON"):
        load_config(tmp_path / "c.yaml")
    with pytest.raises(ConfigError, match=r"missing\.yaml: cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_a_native_file_without_apiversion_says_what_to_add(tmp_path: Path) -> None:
    path = tmp_path / "dp.yaml"
    path.write_text("pools: [{mode: shared}]\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == (
        f"{path}: no apiVersion/kind: add `apiVersion: rdmaplane.io/v1alpha1` and "
        "`kind: DevicePluginConfig` at the top (keys are camelCase; see docs/device-plugin.md), "
        "or give the shared RDMA plugin's configList"
    )


def test_cli_bad_config_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "dp.yaml"
    bad.write_text(
        f"apiVersion: {API_VERSION}\nkind: DevicePluginConfig\npools: [{{mode: exclusiv}}]\n"
    )
    result = CliRunner().invoke(app, ["device-plugin", "--config", str(bad)])
    assert result.exit_code == 2
    assert "pools[0].mode" in result.output


def test_cli_unusable_kubelet_dir_fails_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "dp.yaml"
    config.write_text(f"apiVersion: {API_VERSION}\nkind: DevicePluginConfig\n")
    sysfs = tmp_path / "sys"
    sysfs.mkdir()
    (tmp_path / "device-plugins").write_text("not a folder")
    args = ["device-plugin", "--config", str(config), "--sysfs-root", str(sysfs)]
    # a real process: the command becomes the serving process (os.execv), which fails
    done = subprocess.run(
        [sys.executable, "-m", "rdmaplane", *args, "--kubelet-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    last = done.stderr.splitlines()[-1]
    assert last.startswith("error: cannot serve on") and "File exists" in last
    assert "Traceback" not in done.stderr
