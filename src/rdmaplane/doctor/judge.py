"""Turn parsed measurements into verdicts against what the hardware can do.

Pure functions: the line rate comes from the node model (or the user), the figures from the
parsers. Thresholds are the field's rules of thumb: ib_write_bw reaches 95-98 % of line rate on
healthy links (we pass at 90 %), NCCL busbw between nodes should reach 80 % of the NIC aggregate.
"""

from __future__ import annotations

from collections.abc import Mapping

from rdmaplane.doctor import ncclenv
from rdmaplane.doctor.parse_nccl_log import NcclLog
from rdmaplane.doctor.parse_nccl_tests import NcclTestsResult
from rdmaplane.doctor.parse_perftest import BwResult
from rdmaplane.doctor.verdict import Finding, Status
from rdmaplane.model import Hca, NodeTopology
from rdmaplane.topology import Relation, pci_relation

BW_PASS = 0.90
BUSBW_PASS = 0.80


def compute_hcas(topo: NodeTopology, env: Mapping[str, str]) -> list[Hca]:
    """The HCAs NCCL traffic uses: those NCCL_IB_HCA selects, else the ones that sit at most a
    PCIe switch level (PXB) from some GPU, else every HCA with an ACTIVE port."""
    up = [h for h in topo.hcas if any(p.is_up for p in h.ports)]
    if raw := env.get("NCCL_IB_HCA"):
        try:
            chosen = set(ncclenv.selected(ncclenv.parse_device_list(raw), [h.name for h in up]))
        except ValueError:
            chosen = set()
        if chosen:
            return [h for h in up if h.name in chosen]
    paired = [
        h
        for h in up
        if h.pci and any(pci_relation(g.pci, h.pci) <= Relation.PXB for g in topo.gpus)
    ]
    return paired or up


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


def judge_nccl_tests(
    result: NcclTestsResult, aggregate: float | None, threshold: float = BUSBW_PASS
) -> list[Finding]:
    """`aggregate`: one node's NIC aggregate in Gb/s (None when unknown)."""
    findings: list[Finding] = []
    if result.wrong_total or result.oob_ok is False:
        findings.append(
            Finding(
                "correctness",
                Status.FAIL,
                f"#wrong total {result.wrong_total:g}; out of bounds values: "
                f"{result.oob_values if result.oob_values is not None else '?'}",
                "wrong results mean data corruption: check GPU memory (dcgmi diag) and NCCL "
                "version skew between ranks",
            )
        )
    else:
        findings.append(Finding("correctness", Status.PASS, "#wrong 0"))
    peak, avg = result.peak_busbw, result.avg_busbw
    size = result.peak_row.size
    figures = f"peak busbw {peak:.1f} GB/s at {_bytes(size)}, avg {avg:.1f} GB/s"
    nodes = len(result.hosts)
    if nodes == 1:
        findings.append(
            Finding(
                "busbw",
                Status.PASS,
                f"{figures}; one node: NVLink/PCIe, the NICs are not measured",
                None,
            )
        )
        return findings
    if not aggregate:
        findings.append(
            Finding(
                "busbw",
                Status.WARN,
                f"{figures}; NIC aggregate unknown",
                "pass --line-rate GBPS (sum of one node's compute NIC rates) or --root",
            )
        )
        return findings
    share = peak * 8 / aggregate
    detail = f"{figures} = {share:.0%} of the {aggregate:g} Gb/s NIC aggregate" + (
        f" ({nodes} nodes)" if nodes else ""
    )
    if share >= threshold:
        findings.append(Finding("busbw", Status.PASS, detail))
    else:
        findings.append(
            Finding(
                "busbw",
                Status.FAIL,
                f"{detail} (pass ≥ {threshold:.0%})",
                "rerun with NCCL_DEBUG=INFO and feed the log to `rdmaplane doctor nccl-log`: "
                "socket fallback, GDR off or too few HCAs show there",
            )
        )
    return findings


def judge_nccl_log(log: NcclLog) -> list[Finding]:
    findings = [d.finding for d in log.diagnoses]
    if log.rdma_used:
        findings.insert(
            0, Finding("transport", Status.PASS, "every rank with a network uses IB/RoCE")
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
