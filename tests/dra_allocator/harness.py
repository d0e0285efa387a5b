"""Upstream's DRA allocator as the judge of what a claim costs kube-scheduler on one node.

The Go harness `upstream/dra-allocator` (built by `scripts/build-k8s.sh dra-allocator`) runs
`k8s.io/dynamic-resource-allocation/structured` v0.37.2, the allocator kube-scheduler v1.37.2's
DRA plugin runs in Filter for every node it visits, with v1.37's default feature gates (so its
"incubating" variant). It is fed, for every bundled sample as a node:

- the ResourceSlice rdmaplane's DRA driver publishes for it (the driver's own `offer` and
  `slice_objects`, the default pools, binding conditions on, the compute HCAs cabled
  rail-optimised so that each names its `rail`: HCA k on rail k, as the agent's fabric source
  says when nothing says more);
- its GPUs as NVIDIA's GPU DRA driver publishes them (`tests.e2e.dra.gpu_slice`: `gpu-<minor>`
  with `resource.kubernetes.io/pcieRoot`, `pciBusID`, `numaNode`) and both DeviceClasses;
- the node in `STATES`: empty, half full, one device short (one compute NIC taken; or a one-pair
  pod's GPU and NIC), full;

and every claim asked for (`deploy/dra/claim-templates.yaml`'s templates and `ONE_GPU`, the
one-device claim every figure is compared with). It answers, per node, state and claim, the
median time of an Allocate call, the search's steps, and the allocation.

`python -m tests.dra_allocator.harness` prints the per-template table of docs/dra.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rdmaplane.adapters.discovery import samples
from rdmaplane.core.model import NodeTopology
from rdmaplane.core.nrt import Uplink
from rdmaplane.core.selectors import compute_ports, natural_key

# Every rdmaplane module this tier uses, in one place.
from rdmaplane.core.settings.deviceplugin import PluginSettings
from rdmaplane.core.settings.dra import DraSettings
from rdmaplane.services.dra.driver import pools_of
from rdmaplane.services.dra.policy.devices import NUMA_NODE, PCIE_ROOT, offer
from rdmaplane.services.dra.policy.slices import slice_objects
from tests.e2e.dra import GPU_CLASS, GPU_DRIVER, gpu_slice

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-k8s.sh"
TEMPLATES = REPO / "deploy" / "dra" / "claim-templates.yaml"
# The claim templates rdmaplane ships: deploy/dra's and the rails example docs/dra.md shows.
TEMPLATE_FILES = (TEMPLATES, REPO / "examples" / "dra-rails.yaml")
DEVICE_CLASS = REPO / "deploy" / "dra" / "deviceclass.yaml"
DRIVER = "rdma.rdmaplane.io"
# The claim every figure is compared with: one GPU, no constraint (upstream's own benchmark
# asks one device per request, no constraint).
ONE_GPU = "one-gpu"
ONE_GPU_SPEC = {
    "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": GPU_DRIVER}}]}
}
STATES = ("empty", "half", "gpu-short", "nic-short", "pair-short", "full")
STATE_WORDS = {
    "empty": "nothing allocated",
    "half": "the first half of the GPUs and of the compute NICs taken (a half-node pod)",
    "gpu-short": "one GPU taken (the last), every NIC free",
    "nic-short": "one compute NIC taken (the one beside the last GPU), every GPU free",
    "pair-short": "a one-pair pod: the last GPU and the NIC on its root taken",
    "full": "every GPU and every NIC taken",
}


class HarnessMissing(RuntimeError):
    """The harness binary has not been built."""


def harness_binary() -> Path:
    """`RDMAPLANE_DRA_ALLOCATOR` (set by `make test`), else where the build script puts it."""
    configured = os.environ.get("RDMAPLANE_DRA_ALLOCATOR")
    if configured:
        path = Path(configured)
    else:
        out = subprocess.run(
            [str(BUILD_SCRIPT), "dra-allocator", "--path"], capture_output=True, text=True
        )
        path = Path(out.stdout.strip())
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise HarnessMissing(
            f"DRA allocator harness {path} missing: run `make k8s-bins` (or "
            f"{BUILD_SCRIPT.relative_to(REPO)} dra-allocator), or leave this tier out with "
            "-m 'not dra_allocator'"
        )
    return path


# ---------------------------------------------------------------------------------------------
# The nodes


@dataclass(frozen=True)
class Node:
    """A sample as a node: its slices and the facts the states and the judges need."""

    name: str
    topo: NodeTopology
    slices: tuple[dict[str, Any], ...]
    nics: tuple[str, ...]  # rdmaplane's devices, in slice order
    compute: tuple[str, ...]  # the devices of the compute HCAs, rail order
    roots: Mapping[str, str]  # device id (driver/pool/device) → PCIe root
    numa: Mapping[str, int]  # device id → NUMA node, where published

    def gpu(self, index: int) -> str:
        return f"{GPU_DRIVER}/{self.name}/gpu-{index}"

    def nic(self, name: str) -> str:
        return f"{DRIVER}/{self.name}/{name}"

    def gpus(self) -> list[str]:
        return [self.gpu(g.index) for g in self.topo.gpus]

    def state(self, name: str) -> list[str]:
        """The devices already allocated in state `name` (`STATES`)."""
        gpus, compute = self.gpus(), [self.nic(n) for n in self.compute]
        if name == "empty":
            return []
        if name == "full":
            return gpus + [self.nic(n) for n in self.nics]
        if name == "half":
            return gpus[: len(gpus) // 2] + compute[: len(compute) // 2]
        last = gpus[-1]
        beside = [n for n in compute if self.roots.get(n) == self.roots[last]]
        nic = (beside or compute or [self.nic(n) for n in self.nics])[-1:]
        if name == "gpu-short":
            return [last]
        if name == "nic-short":
            return nic
        if name == "pair-short":
            return [last, *beside[:1]]
        raise ValueError(f"no state {name!r}")


def rails(topo: NodeTopology) -> list[Uplink]:
    """The compute HCAs (the fastest class that is up) cabled rail-optimised: HCA k (natural
    name order) on rail k."""
    hcas = sorted(
        {h.name: h for h, _ in compute_ports(topo)}.values(), key=lambda h: natural_key(h.name)
    )
    return [
        Uplink(h.name, f"rail-{k}", k, "", h.numa if h.numa is not None else -1, h.pcie_root)
        for k, h in enumerate(hcas)
    ]


def sample_node(name: str) -> Node:
    topo = samples.read_sample(name)
    uplinks = rails(topo)
    devices = offer(topo, pools_of(PluginSettings().pools, DraSettings().sharing), uplinks)
    binding = DraSettings().binding_conditions
    ours = slice_objects(DRIVER, name, list(devices.values()), {}, 1, binding=binding)
    slices = (*ours, gpu_slice(name, topo))
    roots: dict[str, str] = {}
    numa: dict[str, int] = {}
    for s in slices:
        for d in s["spec"]["devices"]:
            key = f"{s['spec']['driver']}/{name}/{d['name']}"
            attrs = d["attributes"]
            if PCIE_ROOT in attrs:
                roots[key] = attrs[PCIE_ROOT]["string"]
            if NUMA_NODE in attrs:
                numa[key] = attrs[NUMA_NODE]["int"]
    by_hca = {d.hca: n for n, d in devices.items()}
    compute = tuple(by_hca[u.hca] for u in uplinks if u.hca in by_hca)
    nics = tuple(d["name"] for s in ours for d in s["spec"]["devices"])
    return Node(name, topo, slices, nics, compute, roots, numa)


def nodes() -> list[Node]:
    """Every bundled sample."""
    return [sample_node(name) for name in samples.names()]


# ---------------------------------------------------------------------------------------------
# The claims


def templates(path: Path = TEMPLATES) -> dict[str, dict[str, Any]]:
    """The ResourceClaimTemplates of a file, by name."""
    return {
        d["metadata"]["name"]: d
        for d in yaml.safe_load_all(path.read_text())
        if d and d.get("kind") == "ResourceClaimTemplate"
    }


def claim_specs(found: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """`ONE_GPU` and the claims the templates make, by name."""
    return {ONE_GPU: ONE_GPU_SPEC, **{n: t["spec"]["spec"] for n, t in found.items()}}


def device_classes() -> list[dict[str, Any]]:
    """The driver's DeviceClass (deploy/dra/deviceclass.yaml also holds the classes that serve
    extended resources, which no template names) and NVIDIA's GPU class."""
    ours = [
        d
        for d in yaml.safe_load_all(DEVICE_CLASS.read_text())
        if d and d.get("kind") == "DeviceClass" and d["metadata"]["name"] == DRIVER
    ]
    return [*ours, GPU_CLASS]


# ---------------------------------------------------------------------------------------------
# Running it


@dataclass(frozen=True, slots=True)
class Figure:
    node: str
    state: str
    claim: str
    allocated: bool
    error: str
    timed_out: bool
    calls: int
    median_ns: int  # wall clock
    cpu_ns: int  # the CPU time of the thread that called (median)
    steps: int
    devices: tuple[tuple[str, str, str], ...]  # (request, driver, device)


@dataclass(frozen=True)
class Run:
    allocator: str
    module: str
    figures: tuple[Figure, ...]

    def get(self, node: str, state: str, claim: str) -> Figure:
        return next(f for f in self.figures if (f.node, f.state, f.claim) == (node, state, claim))

    def ratio(self, f: Figure) -> float:
        """Its median CPU time over the one-GPU claim's on the same node in the same state."""
        return f.cpu_ns / max(self.get(f.node, f.state, ONE_GPU).cpu_ns, 1)


def run(
    binary: Path,
    claims: Mapping[str, Any],
    on: Sequence[Node],
    states: Iterable[str] = STATES,
    *,
    min_rounds: int = 7,
    min_seconds: float = 0.05,
    slow_rounds: int = 3,
    timeout_s: float = 10.0,
) -> Run:
    """Every claim on every node in every state, in one harness process."""
    document = harness_input(
        claims,
        on,
        states,
        min_rounds=min_rounds,
        min_seconds=min_seconds,
        slow_rounds=slow_rounds,
        timeout_s=timeout_s,
    )
    out = subprocess.run(
        [str(binary)], input=json.dumps(document), capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"{binary} failed ({out.returncode}): {out.stderr.strip()}")
    return _answer(json.loads(out.stdout))


def harness_input(
    claims: Mapping[str, Any],
    on: Sequence[Node],
    states: Iterable[str] = STATES,
    *,
    min_rounds: int = 7,
    min_seconds: float = 0.05,
    slow_rounds: int = 3,
    timeout_s: float = 10.0,
) -> dict[str, Any]:
    """The harness's input document (upstream/dra-allocator/main.go says what it holds)."""
    return {
        "classes": device_classes(),
        "nodes": [{"name": n.name, "slices": list(n.slices)} for n in on],
        "claims": [{"name": name, "spec": spec} for name, spec in claims.items()],
        "states": [
            {"node": n.name, "name": s, "allocated": n.state(s)} for n in on for s in list(states)
        ],
        "minRounds": min_rounds,
        "minSeconds": min_seconds,
        "slowRounds": slow_rounds,
        "timeoutSeconds": timeout_s,
    }


def _answer(answer: Mapping[str, Any]) -> Run:
    figures = tuple(
        Figure(
            r["node"],
            r["state"],
            r["claim"],
            r["allocated"],
            r["error"],
            r["timedOut"],
            r["calls"],
            r["medianNs"],
            r["cpuMedianNs"],
            r["steps"],
            tuple((d["request"], d["driver"], d["device"]) for d in r["devices"] or ()),
        )
        for r in answer["results"]
    )
    return Run(answer["allocator"], answer["module"], figures)


# ---------------------------------------------------------------------------------------------
# The table of docs/dra.md


def table(result: Run, claims: Iterable[str], states: Sequence[str] = STATES) -> str:
    """Per claim and state: the median over the nodes of its CPU time per Allocate call as a
    multiple of the one-GPU claim's on the same node in the same state, the worst node's (and
    which), and the most steps any node took; "timed out" when a call ran out of time."""
    lines = [
        "| claim | " + " | ".join(states) + " |",
        "|---|" + "---|" * len(states),
    ]
    for claim in claims:
        cells = []
        for state in states:
            figs = [f for f in result.figures if f.claim == claim and f.state == state]
            if not figs:
                cells.append("—")
                continue
            if claim == ONE_GPU:
                us = statistics.median(f.cpu_ns for f in figs) / 1000
                cells.append(f"{us:.0f} µs, {_steps(max(f.steps for f in figs))}")
                continue
            worst = max(figs, key=result.ratio)
            ratio = statistics.median(result.ratio(f) for f in figs)
            steps = max(f.steps for f in figs)
            late = ", timed out" if any(f.timed_out for f in figs) else ""
            cells.append(
                f"{ratio:.1f}× ({result.ratio(worst):.0f}× {worst.node}), {_steps(steps)}{late}"
            )
        lines.append(f"| `{claim}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _steps(n: int) -> str:
    return f"{n:,} step" + ("" if n == 1 else "s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--templates", type=Path, nargs="+", default=list(TEMPLATE_FILES))
    parser.add_argument("--samples", nargs="*", default=None, help="default: every sample")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds a call may take")
    parser.add_argument("--json", action="store_true", help="every figure, as JSON")
    parser.add_argument(
        "--write-input", type=Path, help="write the harness's input there, run nothing"
    )
    args = parser.parse_args(argv)
    found: dict[str, dict[str, Any]] = {}
    for path in args.templates:
        found |= templates(path)
    on = [sample_node(s) for s in args.samples] if args.samples else nodes()
    if args.write_input:
        document = harness_input(claim_specs(found), on, min_rounds=args.rounds)
        args.write_input.write_text(json.dumps(document))
        return 0
    result = run(
        harness_binary(), claim_specs(found), on, min_rounds=args.rounds, timeout_s=args.timeout
    )
    if args.json:
        json.dump([_fig(f) for f in result.figures], sys.stdout, indent=1)
        return 0
    print(f"{result.module}, allocator {result.allocator}; nodes: {', '.join(n.name for n in on)}")
    print(table(result, [ONE_GPU, *found]))
    for state, words in STATE_WORDS.items():
        print(f"{state}: {words}")
    return 0


def _fig(f: Figure) -> dict[str, Any]:
    return {k: getattr(f, k) for k in Figure.__slots__}


if __name__ == "__main__":
    sys.exit(main())
