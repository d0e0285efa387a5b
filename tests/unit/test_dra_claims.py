"""An allocated claim → CDI spec and NCCL/UCX environment of exactly its devices; every bad
claim a one-line error naming it, never an exception of another kind."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import referencing
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmaplane.adapters.config import ConfigError
from rdmaplane.adapters.discovery.samples import read_sample
from rdmaplane.core.nccl import NcclSettings
from rdmaplane.core.nrt import Uplink
from rdmaplane.core.selectors import Selectors
from rdmaplane.services.dra.driver import read_device_config
from rdmaplane.services.dra.policy.claims import (
    ClaimError,
    ClaimRef,
    PreparedClaim,
    prepare,
    spec_name,
)
from rdmaplane.services.dra.policy.devices import DraDevice, DraPool, offer

DRIVER = "rdma.rdmaplane.io"
NODE = "node-a"
UID = "4f1b5e0c-9a7d-4c1e-8f3a-2b6d7e8f9a01"
REF = ClaimRef("team", "train-0", UID)
TOPO = read_sample("hgx-h100-roce")
DEVICES = offer(TOPO, [DraPool("rdmaplane.io/hca", Selectors())])
BY_HCA = {d.hca: d for d in DEVICES.values()}
SCHEMA_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "cdi"
CDI_NAME = r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$"


def cdi_validator() -> jsonschema.protocols.Validator:
    """The CDI project's own schema (tests/fixtures/cdi), with its defs.json reference."""
    schema = json.loads((SCHEMA_DIR / "schema.json").read_text())
    defs = json.loads((SCHEMA_DIR / "defs.json").read_text())
    registry = referencing.Registry().with_resource(
        "defs.json", referencing.Resource.from_contents(defs, referencing.jsonschema.DRAFT7)
    )
    return jsonschema.Draft7Validator(schema, registry=registry)


CDI = cdi_validator()


def claim(
    results: Sequence[tuple[str, DraDevice]],
    config: Sequence[Mapping[str, Any]] = (),
    uid: str = UID,
    pool: str = NODE,
) -> dict[str, Any]:
    return {
        "metadata": {"name": REF.name, "namespace": REF.namespace, "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": r, "driver": DRIVER, "pool": pool, "device": d.name}
                        for r, d in results
                    ]
                    + [
                        {
                            "request": "gpu-0",
                            "driver": "gpu.nvidia.com",
                            "pool": NODE,
                            "device": "gpu-0",
                        }
                    ],
                    "config": list(config),
                }
            }
        },
    }


def run(
    obj: Mapping[str, Any],
    *,
    devices: Mapping[str, DraDevice] = DEVICES,
    present: Any = lambda _name: True,
    settings_: Mapping[str, NcclSettings] | None = None,
) -> PreparedClaim:
    return prepare(
        obj,
        REF,
        driver=DRIVER,
        pool=NODE,
        devices=devices,
        topo=TOPO,
        pool_settings=settings_ or {"rdmaplane.io/hca": NcclSettings()},
        read_config=read_device_config,
        present=present,
    )


def env_of(prepared: PreparedClaim) -> dict[str, str]:
    assert prepared.spec is not None
    return dict(e.split("=", 1) for e in prepared.spec["containerEdits"]["env"])


def test_four_nics_give_one_spec_with_their_nodes_and_their_environment() -> None:
    picked = [(f"nic-{k}", BY_HCA[f"mlx5_{k}"]) for k in range(4)]
    prepared = run(claim(picked))

    assert prepared.spec is not None
    CDI.validate(prepared.spec)
    assert prepared.spec_name == f"k8s.{DRIVER}-claim_{UID}" == spec_name(DRIVER, UID)
    assert prepared.spec["kind"] == f"k8s.{DRIVER}/claim"
    env = env_of(prepared)
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert env["NCCL_IB_GID_INDEX"] == "3"
    assert prepared.spec["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/infiniband/rdma_cm", "permissions": "rw"}
    ]
    for k, (device, spec_device) in enumerate(
        zip(prepared.devices, prepared.spec["devices"], strict=True)
    ):
        hca = TOPO.hca(f"mlx5_{k}")
        assert hca is not None
        assert device.requests == (f"nic-{k}",)
        assert device.pool == NODE and device.device == BY_HCA[f"mlx5_{k}"].name
        assert device.cdi_ids == (f"k8s.{DRIVER}/claim={spec_device['name']}",)
        paths = [n["path"] for n in spec_device["containerEdits"]["deviceNodes"]]
        assert paths == [f"/dev/infiniband/{hca.uverbs}", f"/dev/infiniband/{hca.ports[0].umad}"]


def test_devices_that_name_their_rail_tell_the_claim_its_rails() -> None:
    """HCA k cabled into rail 7 - k: the claim's env names each HCA's rail, in RDMAPLANE_HCAS's
    order; a claim with a device of unknown rail gets no partial list."""
    uplinks = [Uplink(f"mlx5_{k}", f"rail-{7 - k}", 7 - k) for k in range(4)]
    cabled = {
        d.hca: d for d in offer(TOPO, [DraPool("rdmaplane.io/hca", Selectors())], uplinks).values()
    }
    picked = [("nic-0", cabled["mlx5_2"]), ("nic-1", cabled["mlx5_0"])]
    env = env_of(run(claim(picked), devices={d.name: d for d in cabled.values()}))
    assert (env["RDMAPLANE_HCAS"], env["RDMAPLANE_RAILS"]) == ("mlx5_0,mlx5_2", "7,5")
    unknown = [*picked, ("nic-2", cabled["mlx5_5"])]
    assert "RDMAPLANE_RAILS" not in env_of(
        run(claim(unknown), devices={d.name: d for d in cabled.values()})
    )
    assert "RDMAPLANE_RAILS" not in env_of(run(claim([("nic-0", BY_HCA["mlx5_0"])])))  # no fabric


@settings(max_examples=60)
@given(st.lists(st.sampled_from(sorted(DEVICES)), min_size=1, max_size=9, unique=True))
def test_any_set_of_devices_gets_exactly_its_own_environment(names: list[str]) -> None:
    picked = [(f"req-{i}/sub", DEVICES[n]) for i, n in enumerate(names)]
    prepared = run(claim(picked))

    assert prepared.spec is not None
    CDI.validate(prepared.spec)
    hcas = {f"{DEVICES[n].hca}:{DEVICES[n].port}" for n in names}
    assert set(env_of(prepared)["NCCL_IB_HCA"].removeprefix("=").split(",")) == hcas
    assert set(env_of(prepared)["UCX_NET_DEVICES"].split(",")) == hcas
    spec_names = [d["name"] for d in prepared.spec["devices"]]
    assert len(set(spec_names)) == len(names)
    assert all(re.match(CDI_NAME, n) for n in spec_names)
    ids = [i for d in prepared.devices for i in d.cdi_ids]
    assert sorted(ids) == sorted(f"k8s.{DRIVER}/claim={n}" for n in spec_names)
    assert [d.requests for d in prepared.devices] == [(f"req-{i}",) for i in range(len(names))]


def test_the_schema_is_no_rubber_stamp() -> None:
    good = run(claim([("nic", BY_HCA["mlx5_0"])])).spec
    assert good is not None
    bad = {**good, "devices": [{"name": "x"}]}  # a device without containerEdits
    with pytest.raises(jsonschema.ValidationError, match="containerEdits"):
        CDI.validate(bad)
    with pytest.raises(jsonschema.ValidationError):
        CDI.validate({**good, "containerEdits": {"env": "NCCL_IB_HCA=x"}})


def test_a_claim_without_our_devices_needs_no_spec() -> None:
    prepared = run(claim([]))
    assert prepared.devices == () and prepared.spec is None


def test_device_nodes_that_are_not_there_are_left_out_but_a_missing_verbs_node_fails() -> None:
    picked = [("nic", BY_HCA["mlx5_0"])]
    prepared = run(claim(picked), present=lambda name: name.startswith("uverbs"))
    assert prepared.spec is not None
    assert prepared.spec["containerEdits"]["deviceNodes"] == []
    with pytest.raises(ClaimError, match=r"claim team/train-0: mlx5_0 has no verbs device node"):
        run(claim(picked), present=lambda _name: False)


OPAQUE = {"apiVersion": "rdmaplane.io/v1alpha1", "kind": "RdmaDeviceConfig"}


def opaque(
    parameters: object, requests: Sequence[str] = (), source: str = "FromClaim"
) -> dict[str, Any]:
    return {
        "source": source,
        "requests": list(requests),
        "opaque": {"driver": DRIVER, "parameters": parameters},
    }


def test_claim_configuration_overrides_the_class_and_the_pool() -> None:
    picked = [("nic-0", BY_HCA["mlx5_0"]), ("nic-1", BY_HCA["mlx5_1"])]
    config = [
        opaque({**OPAQUE, "nccl": {"trafficClass": 106, "socketIfname": "=eth0"}}),
        opaque({**OPAQUE, "nccl": {"trafficClass": 41}}, source="FromClass"),
        {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"x": 1}}},
    ]
    env = env_of(run(claim(picked, config)))
    assert env["NCCL_IB_TC"] == "106" and env["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert "NCCL_IB_TC" not in env_of(run(claim(picked)))


def test_a_config_for_some_requests_only_is_refused_when_the_claim_has_more() -> None:
    picked = [("nic-0", BY_HCA["mlx5_0"]), ("nic-1/fast", BY_HCA["mlx5_1"])]
    config = [opaque({**OPAQUE, "nccl": {"trafficClass": 106}}, requests=["nic-1"])]
    with pytest.raises(ClaimError, match=r"claim team/train-0: its devices get different NCCL"):
        run(claim(picked, config))
    both = [opaque({**OPAQUE, "nccl": {"trafficClass": 106}}, requests=["nic-0", "nic-1/fast"])]
    assert env_of(run(claim(picked, both)))["NCCL_IB_TC"] == "106"


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ("not an object", r"config\[0\] \(FromClaim\): expected a mapping"),
        ({"kind": "RdmaDeviceConfig"}, r"config\[0\] \(FromClaim\): apiVersion: missing"),
        ({**OPAQUE, "nccl": {"trafficClass": 999}}, r"nccl.trafficClass: Input should be less"),
        ({**OPAQUE, "ncl": {}}, r"ncl: unknown key \(did you mean nccl\?\)"),
        ({**OPAQUE, "nccl": {"ncclVersion": "two"}}, r"nccl.ncclVersion: 'two' is not a version"),
        ({**OPAQUE, "kind": "AgentConfig"}, r"kind: 'AgentConfig'; expected RdmaDeviceConfig"),
        (None, r"config\[0\] \(FromClaim\): empty"),
    ],
)
def test_malformed_opaque_configuration_is_one_error_naming_the_claim_and_key(
    parameters: object, message: str
) -> None:
    picked = [("nic-0", BY_HCA["mlx5_0"])]
    with pytest.raises(ClaimError) as caught:
        run(claim(picked, [opaque(parameters)]))
    text = str(caught.value)
    assert text.startswith("claim team/train-0: config[0] (FromClaim): "), text
    assert "\n" not in text
    assert re.search(message, text), text


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (claim([("nic", BY_HCA["mlx5_0"])], uid="another"), "the API server holds UID another"),
        ({"metadata": {"uid": UID}, "status": {}}, "not allocated"),
        ({"metadata": {"uid": UID}, "status": "junk"}, "status is not an object"),
        (
            {"metadata": {"uid": UID}, "status": {"allocation": {"devices": {"results": "x"}}}},
            "results is not a list of objects",
        ),
        (claim([("nic", BY_HCA["mlx5_0"])], pool="node-b"), "allocated from pool 'node-b'"),
        (
            claim([("nic", DraDevice("pci-gone-p1", "mlx5_42", 1, "rdmaplane.io/hca"))]),
            "device pci-gone-p1 \\(request nic\\) is not on this node any more",
        ),
    ],
)
def test_claims_that_cannot_be_prepared_say_why(obj: Mapping[str, Any], message: str) -> None:
    with pytest.raises(ClaimError, match=f"^claim team/train-0: .*{message}"):
        run(obj)


def test_a_device_that_vanished_since_the_allocation_fails_its_claim() -> None:
    picked = [("nic", BY_HCA["mlx5_2"])]
    left = {n: d for n, d in DEVICES.items() if d.hca != "mlx5_2"}
    with pytest.raises(ClaimError, match="is not on this node any more"):
        run(claim(picked), devices=left)


def test_read_device_config_reads_the_pool_section_shape() -> None:
    settings_ = read_device_config({**OPAQUE, "nccl": {"gid": {"addrFamily": 6}}}, "here")
    assert settings_ is not None and settings_.gid_policy.family == 6
    assert read_device_config(OPAQUE, "here") is None
    with pytest.raises(ConfigError, match=r"^here: expected a mapping"):
        read_device_config([], "here")


def test_two_shares_of_one_port_give_two_cdi_devices_and_the_port_once_in_the_environment() -> None:
    device = BY_HCA["mlx5_2"]
    shares = ["0b0f5c9e-0000-4000-8000-000000000001", "0b0f5c9e-0000-4000-8000-000000000002"]
    obj = claim([("nic-0", device), ("nic-1", device)])
    results = obj["status"]["allocation"]["devices"]["results"]
    for result, share in zip(results, shares, strict=False):
        result["shareID"] = share
    prepared = run(obj)

    assert prepared.spec is not None
    CDI.validate(prepared.spec)
    assert [d.share_id for d in prepared.devices] == shares
    names = [d["name"] for d in prepared.spec["devices"]]
    assert names == [f"{UID}-{device.name}-{s}" for s in shares]
    assert env_of(prepared)["NCCL_IB_HCA"] == "=mlx5_2:1"
