"""Turn parsed measurements into verdicts against what the hardware can do.

Pure functions: the line rate comes from the node model (or the user), the figures from the
parsers. Thresholds are the field's rules of thumb: ib_write_bw reaches 95-98 % of line rate on
healthy links (we pass at 90 %), NCCL busbw between nodes should reach 80 % of the NIC aggregate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rdmaplane.core.model import Hca, NodeTopology
from rdmaplane.core.topology import Relation, pci_relation
from rdmaplane.services.doctor.policy import ncclenv
from rdmaplane.services.doctor.policy.parse_nccl_log import NcclLog, network_kind
from rdmaplane.services.doctor.policy.parse_nccl_tests import NcclTestsResult
from rdmaplane.services.doctor.policy.parse_perftest import BwResult
from rdmaplane.services.doctor.policy.verdict import Finding, Status

BW_PASS = 0.90
BUSBW_PASS = 0.80


@dataclass(frozen=True, slots=True)
class HcaChoice:
    """The HCAs a figure is judged against, what chose them, and what went wrong choosing."""

    hcas: list[Hca]
    basis: str
    problem: str | None = None  # NCCL_IB_HCA given but unusable: said, never silently replaced


def compute_hcas(topo: NodeTopology, env: Mapping[str, str]) -> HcaChoice:
    """The HCAs NCCL traffic uses: those NCCL_IB_HCA selects, else the ones that sit at most a
    PCIe switch level (PXB) from some GPU, else every HCA with an ACTIVE port (software
    devices, rxe and siw, never: their line rate is no NIC's)."""
    up = [h for h in topo.hcas if any(p.is_up for p in h.ports)]
    problem = None
    if raw := env.get("NCCL_IB_HCA"):
        try:
            chosen = set(ncclenv.selected(ncclenv.parse_device_list(raw), [h.name for h in up]))
        except ValueError as e:
            problem = f"NCCL_IB_HCA={raw!r} is malformed ({e}): NCCL would match no HCA with it"
        else:
            if chosen:
                return HcaChoice([h for h in up if h.name in chosen], f"NCCL_IB_HCA={raw}")
            problem = f"NCCL_IB_HCA={raw!r} selects no HCA with an ACTIVE port here"
    paired = [
        h
        for h in up
        if h.dma_pci and any(pci_relation(g.pci, h.dma_pci) <= Relation.PXB for g in topo.gpus)
    ]
    if paired:
        return HcaChoice(paired, f"the {len(paired)} HCA(s) at most PXB from a GPU", problem)
    nics = [h for h in up if h.pci is not None]
    return HcaChoice(nics, f"every HCA with an ACTIVE port ({len(nics)})", problem)


def aggregate_gbps(hcas: list[Hca]) -> float:
    return sum(p.rate_gbps or 0.0 for h in hcas for p in h.ports if p.is_up)


def judge_bw(result: BwResult, line_rate_gbps: float | None, threshold: float = BW_PASS) -> Finding:
    return judge_bw_figure(
        result.banner.device or "?", result.best_average_gbps, line_rate_gbps, threshold
    )


def judge_bw_figure(
    hca: str, gbps: float, line_rate_gbps: float | None, threshold: float = BW_PASS
) -> Finding:
    name = f"bw {hca}"
    if not line_rate_gbps:
        return Finding(
            name,
            Status.WARN,
            f"{gbps:.1f} Gb/s; line rate unknown",
            "pass --line-rate GBPS (the port's `rate` in sysfs)",
        )
    share = gbps / line_rate_gbps
    detail = f"{gbps:.1f} Gb/s = {share:.0%} of {line_rate_gbps:g} Gb/s line rate"
    if share >= threshold:
        return Finding(name, Status.PASS, detail)
    return Finding(
        name,
        Status.FAIL,
        f"{detail} (pass ≥ {threshold:.0%})",
        "check the link (ibstat, error counters), PCIe width/speed of the NIC, MTU 4096, "
        "and PFC/ECN on RoCE fabrics",
    )


def busbw_ceiling(collective: str | None, nodes: int, ranks: int) -> float:
    """The most busbw can exceed one node's NIC aggregate by, as a multiple of it.

    Our own model, not a measurement: with `g = ranks / nodes` GPUs per node, every node must
    move at least `(N-1)/N` of the data through its NICs however NCCL reduces inside the node
    first (tree, NVLS), so busbw ≤ aggregate · (n−1) / (g·(N−1)) — 1.875× for 2 nodes × 8 GPUs,
    approaching 1× as N grows. AllReduce with in-network reduction (SHARP/CollNet) can reach
    2·(n−1)/n. A flat ring stays at or below 1×.
    """
    if nodes < 2 or ranks < nodes:
        return 2.0  # structure unknown: the largest ceiling of any collective
    per_node = ranks / nodes
    hierarchical = (ranks - 1) / (per_node * (nodes - 1))
    if collective and collective.startswith("all_reduce"):
        return max(hierarchical, 2 * (ranks - 1) / ranks)
    return hierarchical


def judge_nccl_tests(
    result: NcclTestsResult,
    aggregate: float | None,
    threshold: float = BUSBW_PASS,
    basis: str | None = None,
) -> list[Finding]:
    """`aggregate`: one node's NIC aggregate in Gb/s (None when unknown), chosen by `basis`."""
    findings = [_correctness(result), *result.failures]
    if not result.rows:
        return findings
    findings.append(_busbw(result, aggregate, threshold, basis))
    return findings


def _correctness(result: NcclTestsResult) -> Finding:
    if result.wrong_total or result.oob_ok is False:
        return Finding(
            "correctness",
            Status.FAIL,
            f"#wrong total {result.wrong_total:g}; out of bounds values: "
            f"{result.oob_values if result.oob_values is not None else '?'}",
            "wrong results mean data corruption: check GPU memory (dcgmi diag) and NCCL "
            "version skew between ranks",
        )
    if not result.rows:
        return Finding("correctness", Status.SKIP, "no result rows: the run did not finish")
    if not result.checked:
        return Finding(
            "correctness", Status.SKIP, "not checked (-c 0: #wrong is N/A)", "rerun with -c 1"
        )
    return Finding("correctness", Status.PASS, "#wrong 0")


def _busbw(
    result: NcclTestsResult, aggregate: float | None, threshold: float, basis: str | None
) -> Finding:
    peak, avg = result.peak_busbw, result.avg_busbw
    at = f"peak busbw {peak:.1f} GB/s at {_bytes(result.peak_row.size)}"
    mean = f"average over all {len(result.rows)} sizes {avg:.1f} GB/s (nccl-tests' mean)"
    nodes = len(result.hosts)
    if result.failures:
        return Finding(
            "busbw",
            Status.SKIP,
            f"{at}; {mean}; not judged: the run failed after {_bytes(result.rows[-1].size)}",
        )
    if nodes == 1:
        return Finding(
            "busbw",
            Status.SKIP,
            f"{at}; {mean}; one node ({result.hosts[0]}): NVLink/PCIe were measured, not the NICs",
            "run across two or more nodes to judge the network",
        )
    if not aggregate:
        return Finding(
            "busbw",
            Status.WARN,
            f"{at}; {mean}; NIC aggregate unknown",
            "pass --line-rate GBPS (sum of one node's compute NIC rates) or --root",
        )
    share = peak * 8 / aggregate
    where = f"{nodes} nodes" if nodes else "hosts unknown: no '# Rank' lines"
    of = f"{aggregate:g} Gb/s NIC aggregate of one node" + (f" ({basis})" if basis else "")
    detail = f"{at} = {share:.0%} of the {of}; {mean}; {where}"
    ceiling = busbw_ceiling(result.collective, nodes, len(result.ranks))
    if share > ceiling:
        return Finding(
            "busbw",
            Status.FAIL,
            f"impossible reading: {detail}; no algorithm moves more than {ceiling:.0%} of the "
            "NIC aggregate between these nodes",
            "the line rate is wrong (--line-rate is one node's total in Gb/s, e.g. 3200 for "
            "8×400G) or the run never crossed the NICs (one NVLink domain, or every rank on one "
            "node): measure the NICs with `rdmaplane doctor perf`",
        )
    if share > 1:
        return Finding(
            "busbw",
            Status.PASS,
            f"{detail}; above the NIC aggregate because NCCL reduced inside each node first "
            f"(tree/NVLS/SHARP; at most {ceiling:.0%} here)",
        )
    if share >= threshold:
        return Finding("busbw", Status.PASS, detail)
    return Finding(
        "busbw",
        Status.FAIL,
        f"{detail} (pass ≥ {threshold:.0%})",
        "rerun with NCCL_DEBUG=INFO and feed the log to `rdmaplane doctor nccl-log`: "
        "socket fallback, GDR off or too few HCAs show there",
    )


_CONNECT_FAILURES = frozenset({"connect-failed", "modify-qp-timeout", "modify-qp-einval"})


def judge_nccl_log(log: NcclLog) -> list[Finding]:
    findings = [d.finding for d in log.diagnoses]
    if log.rdma_used and not log.net_channels and not log.one_node:
        failed = any(f.name in _CONNECT_FAILURES for f in findings)
        other = any(f.status is Status.FAIL for f in findings)
        hosts = len(log.hosts)
        where = f"{hosts} hosts" if hosts > 1 else f"{log.nranks} ranks, one host in the log"
        if failed:
            status, why = Status.FAIL, "the connections between nodes failed (below)"
        elif other:
            status, why = Status.SKIP, "the run failed before any connected (below)"
        else:
            status, why = Status.WARN, "the log ends before they connect"
        findings.insert(
            0,
            Finding(
                "transport",
                status,
                f"NCCL chose an RDMA network for a run across nodes ({where}), but no channel "
                f"crossed nodes: {why}",
                "fix what is below, then rerun"
                if failed or other
                else "feed the log of every rank, to its end",
            ),
        )
    elif log.rdma_used and not log.net_channels:
        findings.insert(
            0,
            Finding(
                "transport",
                Status.SKIP,
                "NCCL chose an RDMA network, but no channel crossed nodes (one node: P2P/SHM "
                "only), so the log does not show RDMA in use",
                "run across two nodes to see NET/IB channels",
            ),
        )
    elif log.rdma_used:
        networks = sorted({r.network for r in log.ranks if r.network})
        findings.insert(
            0,
            Finding(
                "transport",
                Status.PASS,
                f"every rank with a network uses {'/'.join(networks)} (RDMA); "
                f"{log.net_channels} channel(s) cross nodes",
            ),
        )
    elif others := sorted(
        {r.network for r in log.ranks if r.network and network_kind(r.network) == "other"}
    ):
        findings.insert(
            0,
            Finding(
                "transport",
                Status.WARN,
                f"NCCL used the network plugin {', '.join(others)}; the doctor cannot tell "
                "whether it is RDMA",
                "check the plugin's own documentation for how it reports its transport",
            ),
        )
    elif not any(r.network for r in log.ranks):
        findings.insert(
            0,
            Finding(
                "transport",
                Status.WARN,
                "the log does not say which network NCCL used",
                "rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET",
            ),
        )
    return findings


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}"
        n //= 1024
    return str(n)
