"""`rdmaplane doctor`: checks, perftest pair runs, nccl-tests and NCCL log verdicts.

Exit codes: 0 pass (warnings included), 1 a check failed, 2 usage error or unreadable input.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.table import Table

from rdmaplane.cli.common import console, err_console, fail
from rdmaplane.discovery import read_node
from rdmaplane.doctor import checks, judge, pairing, perf, report
from rdmaplane.doctor import parse_nccl_log as nccl_log_parser
from rdmaplane.doctor import parse_nccl_tests as nccl_tests_parser
from rdmaplane.doctor.verdict import Finding, ParseError, Status, exit_code, jsonable, worst

SCHEMA = "rdmaplane.io/doctor/v1"

doctor_app = typer.Typer(
    help="Prove inside the pod that RDMA is really used, and how close to line rate.",
    invoke_without_command=True,
    no_args_is_help=False,
)

OutputOption = Annotated[
    str, typer.Option("-o", "--output", help="table (people) or json (machines).")
]
RootOption = Annotated[
    Path,
    typer.Option(
        "--root",
        metavar="DIR",
        help="Read sysfs at DIR/sys, devices at DIR/dev, /proc at DIR/proc.",
    ),
]
LineRateOption = Annotated[
    float | None,
    typer.Option("--line-rate", metavar="GBPS", help="Override the line rate in Gb/s."),
]

_STYLE = {Status.PASS: "green", Status.WARN: "yellow", Status.FAIL: "bold red"}


def _output_kind(output: str) -> str:
    if output not in ("table", "json"):
        fail(f"-o {output!r}: choose table or json")
    return output


def _read_input(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text(errors="replace")
    except OSError as e:
        fail(f"cannot read {source}: {e.strerror}")


def _findings_table(title: str, findings: list[Finding]) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("check", "status", "detail", "fix"):
        table.add_column(col, overflow="fold")
    for f in findings:
        style = _STYLE[f.status]
        table.add_row(f.name, f"[{style}]{f.status.name}[/]", f.detail, f.fix or "")
    return table


def _finish(kind: str, findings: list[Finding], output: str, extra: Mapping[str, Any]) -> None:
    status = worst(f.status for f in findings)
    if output == "json":
        node = os.environ.get("NODE_NAME") or socket.gethostname()
        doc = {"schema": SCHEMA, "kind": kind, "status": status.name, "node": node, **extra}
        doc["findings"] = jsonable(findings)
        console.print_json(json.dumps(doc, default=str))
    else:
        console.print(_findings_table(kind, findings))
        console.print(f"[{_STYLE[status]}]{status.name}[/]")
    raise typer.Exit(exit_code(status))


@doctor_app.callback()
def run_checks(
    ctx: typer.Context,
    root: RootOption = Path("/"),
    output: OutputOption = "table",
) -> None:
    """Check this pod (or host): RDMA devices, ports, memlock, IPC_LOCK, verbs libraries,
    NCCL variables against the hardware, GPU-NIC pairs, GPUDirect RDMA, /dev/shm."""
    if ctx.invoked_subcommand is not None:
        return
    output = _output_kind(output)
    if not root.is_dir():
        fail(f"--root {root}: not a directory")
    host = checks.Host(root=root)
    node = checks.load(host)
    findings = checks.run_all(host, node)
    _finish(
        "checks",
        findings,
        output,
        {"hostname": node.topo.hostname, "usable_hcas": [h.name for h in node.usable]},
    )


@doctor_app.command("nccl-tests")
def nccl_tests(
    file: Annotated[str, typer.Argument(metavar="FILE|-", help="nccl-tests output.")],
    line_rate: LineRateOption = None,
    threshold: Annotated[float, typer.Option(help="Pass at this share of the aggregate.")] = 0.8,
    root: RootOption = Path("/"),
    output: OutputOption = "table",
) -> None:
    """Judge nccl-tests output (all_reduce_perf and the other collectives): peak and average
    busbw, #wrong, and busbw against one node's NIC aggregate when the run spans nodes."""
    output = _output_kind(output)
    try:
        result = nccl_tests_parser.parse(_read_input(file))
    except ParseError as e:
        fail(str(e))
    aggregate = line_rate
    if aggregate is None and (root / "sys/class/infiniband").is_dir():
        topo = read_node(str(root / "sys"))
        aggregate = judge.aggregate_gbps(judge.compute_hcas(topo, _env())) or None
    findings = judge.judge_nccl_tests(result, aggregate, threshold)
    extra = {
        "collective": result.collective,
        "hosts": list(result.hosts),
        "ranks": len(result.ranks),
        "peak_busbw_gbs": result.peak_busbw,
        "avg_busbw_gbs": result.avg_busbw,
        "wrong": result.wrong_total,
        "nic_aggregate_gbps": aggregate,
    }
    if output == "table":
        console.print(
            f"{result.collective or 'collective'}: {len(result.rows)} sizes, "
            f"{len(result.ranks) or '?'} ranks on {len(result.hosts) or '?'} host(s)"
        )
    _finish("nccl-tests", findings, output, extra)


@doctor_app.command("nccl-log")
def nccl_log(
    file: Annotated[str, typer.Argument(metavar="FILE|-", help="NCCL_DEBUG=INFO output.")],
    output: OutputOption = "table",
) -> None:
    """Say which transport NCCL used per rank (IB/RoCE or sockets), which HCAs, GPUDirect RDMA
    per channel and the GID index, and turn known failures into a fix."""
    output = _output_kind(output)
    try:
        log = nccl_log_parser.parse(_read_input(file))
    except ParseError as e:
        fail(str(e))
    findings = judge.judge_nccl_log(log)
    if output == "table":
        console.print(_ranks_table(log))
        for d in log.diagnoses:
            if d.line:
                console.print(f"line {d.line_no}: {d.line}", soft_wrap=True, markup=False)
    extra = {
        "nccl_version": log.version,
        "rdma_used": log.rdma_used,
        "ranks": jsonable(list(log.ranks)),
        "evidence": [
            {"name": d.finding.name, "line_no": d.line_no, "line": d.line}
            for d in log.diagnoses
            if d.line
        ],
    }
    _finish("nccl-log", findings, output, extra)


def _ranks_table(log: nccl_log_parser.NcclLog) -> Table:
    table = Table(title="transport per rank", title_justify="left")
    for col in ("rank", "host", "gpu", "network", "HCAs", "GDR", "GID index"):
        table.add_column(col)
    for r in log.ranks:
        table.add_row(
            str(r.rank) if r.rank >= 0 else "?",
            r.host or "?",
            "" if r.cuda_dev is None else str(r.cuda_dev),
            r.network or "?",
            " ".join(r.hcas),
            r.gdr,
            ",".join(map(str, r.gid_indices)),
        )
    return table


@doctor_app.command("perf")
def perf_cmd(
    server: Annotated[bool, typer.Option("--server", help="Serve the pair test.")] = False,
    client: Annotated[
        str | None, typer.Option("--client", metavar="PEER", help="Run against PEER.")
    ] = None,
    hca: Annotated[
        list[str] | None, typer.Option("--hca", help="HCA(s) to test [default: compute NICs].")
    ] = None,
    gid_index: Annotated[
        int | None, typer.Option("--gid-index", help="GID index [default: first RoCE v2 IPv4].")
    ] = None,
    use_cuda: Annotated[
        int | None, typer.Option("--use-cuda", metavar="GPU", help="Buffers in this GPU.")
    ] = None,
    duration: Annotated[int, typer.Option(help="Seconds per bandwidth run (-D).")] = 5,
    port: Annotated[
        int, typer.Option(help="First TCP port (perftest and the TCP stream).")
    ] = 18515,
    threshold: Annotated[float, typer.Option(help="Pass at this share of line rate.")] = 0.9,
    line_rate: LineRateOption = None,
    no_tcp: Annotated[bool, typer.Option("--no-tcp", help="Skip the TCP comparison.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds before a run is abandoned.")] = 120.0,
    root: RootOption = Path("/"),
    output: OutputOption = "table",
) -> None:
    """Drive ib_write_bw and ib_write_lat per HCA between two pods (start --server first),
    judge bandwidth against the port's line rate, and compare with a TCP stream."""
    output = _output_kind(output)
    if server == (client is not None):
        fail("give exactly one of --server and --client PEER")
    node = checks.load(checks.Host(root=root))
    usable = {h.name for h in node.usable}
    try:
        plan = perf.plan(node.topo, _env(), hcas=hca or None, gid_index=gid_index, usable=usable)
    except perf.PlanError as e:
        fail(str(e))
    options = perf.Options(
        duration=duration,
        base_port=port,
        use_cuda=use_cuda,
        tcp=not no_tcp,
        timeout=timeout,
        threshold=threshold,
        line_rate=line_rate,
    )
    with perf_progress(output) as progress:
        if client is None:
            result = asyncio.run(perf.serve(plan, options, progress))
        else:
            result = asyncio.run(perf.run_client(client, plan, options, progress))
    if output == "table":
        console.print(_perf_table(result))
        if result.tcp_gbps:
            console.print(f"TCP stream: {result.tcp_gbps:.2f} Gb/s")
    _finish(
        "perf",
        result.findings,
        output,
        {"role": result.role, "runs": jsonable(result.runs), "tcp_gbps": result.tcp_gbps},
    )


def perf_progress(output: str) -> Any:
    """A rich progress bar on stderr; silent for -o json (machines read stdout)."""
    return perf.RichProgress(err_console, enabled=output == "table")


def _perf_table(result: perf.PerfResult) -> Table:
    table = Table(title=f"perftest ({result.role})", title_justify="left")
    for col in ("HCA", "port", "GID", "line rate", "write BW", "share", "latency"):
        table.add_column(col)
    for r in result.runs:
        share = f"{r.bw_gbps / r.line_rate_gbps:.0%}" if r.bw_gbps and r.line_rate_gbps else ""
        table.add_row(
            r.hca,
            str(r.port),
            "" if r.gid_index is None else str(r.gid_index),
            f"{r.line_rate_gbps:g} Gb/s" if r.line_rate_gbps else "?",
            f"{r.bw_gbps:.1f} Gb/s" if r.bw_gbps is not None else r.error or "",
            share,
            f"{r.lat_us:.2f} µs" if r.lat_us is not None else "",
        )
    return table


@doctor_app.command("job")
def job_cmd(
    nodes: Annotated[list[str], typer.Argument(help="Nodes to validate (at least two).")],
    image: Annotated[str, typer.Option(help="Image with rdmaplane and perftest.")] = (
        "ghcr.io/rdmaplane/doctor:latest"
    ),
    namespace: Annotated[str, typer.Option(help="Namespace of the Jobs.")] = "rdmaplane-doctor",
    hcas: Annotated[int, typer.Option(help="rdmaplane.io/hca per pod.")] = 1,
    duration: Annotated[int, typer.Option(help="Seconds per bandwidth run.")] = 5,
) -> None:
    """Print the validation Jobs (YAML): node pairs that cover every node, each running the
    checks and the perf pair test; merge their logs with `rdmaplane doctor report`."""
    try:
        pairs = pairing.cover_pairs(nodes)
    except ValueError as e:
        fail(str(e))
    docs = pairing.manifests(pairs, image=image, namespace=namespace, hcas=hcas, duration=duration)
    for p in pairs:
        err_console.print(f"# round {p.round}: {p.server} (server) ⇄ {p.client} (client)")
    sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False))


@doctor_app.command("report")
def report_cmd(
    files: Annotated[list[str], typer.Argument(metavar="FILE|-...", help="`-o json` outputs.")],
    output: OutputOption = "table",
) -> None:
    """Merge the `-o json` outputs of many pods (checks, perf) into one cluster report."""
    output = _output_kind(output)
    texts = [(f, _read_input(f)) for f in files]
    try:
        merged = report.merge(texts)
    except report.ReportError as e:
        fail(str(e))
    if output == "json":
        console.print_json(json.dumps(jsonable(merged)))
    else:
        table = Table(title="cluster report", title_justify="left")
        for col in ("source", "node", "kind", "status", "failed checks"):
            table.add_column(col, overflow="fold")
        for entry in merged.entries:
            table.add_row(
                entry.source,
                entry.node or "?",
                entry.kind,
                f"[{_STYLE[entry.status]}]{entry.status.name}[/]",
                "; ".join(entry.failed),
            )
        console.print(table)
        console.print(f"[{_STYLE[merged.status]}]{merged.status.name}[/]")
    raise typer.Exit(exit_code(merged.status))


def _env() -> dict[str, str]:
    return dict(os.environ)
