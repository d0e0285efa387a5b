"""`rdmaplane nrt`: the NodeResourceTopology the node agent would publish for a node.

Built by the agent's own code (its embedded device plugin decides what is offered, its health
rules judge the ports, `agent.inventory.nrt_object` writes the object), for a node that no pod
holds devices on yet; for `explain-placement --nrt`, support cases and the docs.
"""

from __future__ import annotations

import tempfile
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rdmaplane.cli.common import (
    SampleOption,
    SnapshotOption,
    SysfsRootOption,
    existing_dir,
    fail,
    load_rdma_node,
)
from rdmaplane.cli.output import write_json, write_yaml
from rdmaplane.core import nrt, paths
from rdmaplane.core.model import NodeTopology, PortObservation
from rdmaplane.core.resources import is_extended

if TYPE_CHECKING:
    from rdmaplane.core.settings.deviceplugin import PluginSettings


class NrtFormat(StrEnum):
    yaml = "yaml"
    json = "json"


# the kubelet's words, as choices for typer (which takes enums)
Policy = StrEnum("Policy", {p: p for p in nrt.POLICIES})  # type: ignore[misc]
Scope = StrEnum("Scope", {s: s for s in nrt.SCOPES})  # type: ignore[misc]


def nrt_command(
    sysfs_root: SysfsRootOption = None,
    snapshot: SnapshotOption = None,
    sample: SampleOption = None,
    node_name: Annotated[
        str | None,
        typer.Option(
            "--node-name", metavar="NAME", help="The Node's name [default: the node's hostname]."
        ),
    ] = None,
    device_plugin_config: Annotated[
        Path | None,
        typer.Option(
            "--device-plugin-config",
            metavar="FILE",
            help="The pools the agent's device plugin offers [default: its defaults].",
        ),
    ] = None,
    gpu_resource: Annotated[
        str,
        typer.Option(
            "--gpu-resource",
            metavar="NAME",
            help="The GPU plugin's resource name (the agent's gpuResource).",
        ),
    ] = nrt.GPU,
    policy: Annotated[
        Policy, typer.Option("--topology-manager-policy", help="The kubelet's policy.")
    ] = Policy("none"),
    scope: Annotated[
        Scope, typer.Option("--topology-manager-scope", help="The kubelet's scope.")
    ] = Scope("container"),
    dev_root: Annotated[
        str | None,  # a str, so that "" is refused rather than read as "."
        typer.Option(
            "--dev-root",
            metavar="DIR",
            help="Where the HCAs' device nodes are (DIR/infiniband/uverbsN); an HCA without "
            "one is not offered [default: /dev for this node; for --sysfs-root, --snapshot and "
            "--sample, every HCA has its device nodes].",
        ),
    ] = None,
    output: Annotated[
        NrtFormat, typer.Option("-o", "--output", help="yaml or json.")
    ] = NrtFormat.yaml,
) -> None:
    """Print the NodeResourceTopology the node agent would publish for this node (or the
    --sysfs-root/--snapshot/--sample one) while no pod holds its devices.

    Feed it to `rdmaplane explain-placement POD --nrt FILE`. Exit 1 when the node has no
    RDMA device, 2 on bad input.
    """
    from rdmaplane.adapters.config import load
    from rdmaplane.adapters.config.deviceplugin import DEVICE_PLUGIN_CONFIG

    plugin_config = load(device_plugin_config, DEVICE_PLUGIN_CONFIG)
    if not is_extended(gpu_resource):
        fail(f"--gpu-resource {gpu_resource!r}: not an extended resource name (domain/name)")
    topo = load_rdma_node(sysfs_root, snapshot, sample)
    name = node_name or topo.hostname
    if not name:
        fail("--node-name: required (the node does not say its hostname)")
    if dev_root is not None:
        existing_dir("--dev-root", dev_root)
    live = sysfs_root is None and snapshot is None and sample is None
    dev = Path(dev_root) if dev_root is not None else Path(paths.DEV) if live else None
    obj = agent_nrt(topo, name, plugin_config, str(policy), str(scope), dev, gpu_resource)
    if output is NrtFormat.json:
        write_json(obj)
    else:
        write_yaml([obj])


def agent_nrt(
    topo: NodeTopology,
    node_name: str,
    plugin_config: PluginSettings,
    policy: str,
    scope: str,
    dev_root: Path | None = None,
    gpu_resource: str = nrt.GPU,
) -> dict[str, object]:
    """The agent's NRT object for `topo` right after its first poll, with no pod on the node;
    `dev_root` None: as on a node where every HCA has its device nodes."""
    if dev_root is None:
        with tempfile.TemporaryDirectory(prefix="rdmaplane-dev-") as folder:
            dev = _device_nodes(topo, Path(folder))
            return agent_nrt(topo, node_name, plugin_config, policy, scope, dev, gpu_resource)
    from rdmaplane.core.allocation import Allocations
    from rdmaplane.core.porthealth import rule_table
    from rdmaplane.services.agent.policy.health import HealthState, step
    from rdmaplane.services.agent.policy.inventory import nrt_object, offered_devices
    from rdmaplane.services.deviceplugin.manager import ResourceManager

    # the embedded device plugin's decisions, without its gRPC servers
    pools = [ResourceManager(p, dev_root=str(dev_root)) for p in plugin_config.pools]
    for pool in pools:
        pool.update(topo, {})
    ports = [
        PortObservation(h.name, p.number, p.state, p.phys_state) for h in topo.hcas for p in h.ports
    ]
    health, _ = step(HealthState(), 0.0, ports, rule_table(60.0, {}, {}))
    return nrt_object(
        node_name,
        topo,
        offered_devices(pools),
        health.hcas,
        Allocations(),
        gpu_resource=gpu_resource,
        policy=policy,
        scope=scope,
        pools=plugin_config.pools,
    )


def _device_nodes(topo: NodeTopology, root: Path) -> Path:
    """`root` as a /dev holding every HCA's verbs, umad and issm node, and rdma_cm."""
    folder = root / "infiniband"
    folder.mkdir()
    names = [
        n for h in topo.hcas for n in (h.uverbs, *(x for p in h.ports for x in (p.umad, p.issm)))
    ]
    for name in ("rdma_cm", *(n for n in names if n)):
        (folder / name).touch()
    return root
