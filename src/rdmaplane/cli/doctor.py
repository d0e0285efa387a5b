"""`rdmaplane doctor`: checks, perftest pair runs, nccl-tests and NCCL log verdicts.

Exit codes: 0 pass (warnings and skips included), 1 a check failed, 2 usage error or input that
is not what it was said to be — always one line on stderr naming the file or flag.

The group's `--root` and `-o` reach every command that takes them (`doctor -o json nccl-log F`
is `doctor nccl-log F -o json`), and a command that has no use for one refuses it.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import sys
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from rdmaplane import IMAGE
from rdmaplane.cli.common import fail, say_warnings
from rdmaplane.cli.output import write_yaml
from rdmaplane.core.resources import HCA, is_extended

if TYPE_CHECKING:
    from rich.table import Table

    from rdmaplane.services.doctor import perf
    from rdmaplane.services.doctor.policy import parse_nccl_log
    from rdmaplane.services.doctor.policy.verdict import Finding

# Far above a 4096-rank NCCL INFO log (tens of MiB); below what would exhaust a pod's memory.
MAX_INPUT = 256 * 1024 * 1024
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")

doctor_app = typer.Typer(
    help="Prove inside the pod that RDMA is really used, and how close to line rate.",
    invoke_without_command=True,
    no_args_is_help=False,
)


class DoctorOutput(StrEnum):
    table = "table"
    json = "json"


OutputOption = Annotated[
    DoctorOutput | None,
    typer.Option("-o", "--output", help="table (people) or json (machines) [default: table]."),
]
RootOption = Annotated[
    str | None,
    typer.Option(
        "--root",
        metavar="DIR",
        help="Read sysfs at DIR/sys, devices at DIR/dev, /proc at DIR/proc [default: /].",
    ),
]
LineRateOption = Annotated[
    float | None,
    typer.Option(
        "--line-rate",
        metavar="GBPS",
        help="Override the line rate in Gb/s (nccl-tests: one node's NIC total, e.g. 3200).",
    ),
]

_STYLE = {"SKIP": "cyan", "PASS": "green", "WARN": "yellow", "FAIL": "bold red"}


def _group_options(
    ctx: typer.Context, command: str, root: str | None = None, output: DoctorOutput | None = None
) -> tuple[Path, str]:
    """The command's --root (a directory) and -o, given to it or to the group (not both);
    exit 2 for a group option the command has no use for."""
    group = ctx.parent.params if ctx.parent is not None else {}
    takes = ctx.command.params
    for flag, name in (("--root", "root"), ("-o", "output")):
        if group.get(name) is None:
            continue
        if not any(p.name == name for p in takes):
            fail(f"doctor {command}: {flag} means nothing here; leave it out")
        if (root if name == "root" else output) is not None:
            fail(f"doctor {command}: {flag} given to doctor and to {command}; give it once")
    root = root if root is not None else group.get("root")
    root = "/" if root is None else root
    chosen = output or group.get("output") or DoctorOutput.table
    return _root_dir(root), str(chosen)


def safe(text: object) -> str:
    """Text for the terminal: rich markup escaped, control characters shown as escapes."""
    from rich.markup import escape

    shown = "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in str(text))
    return escape(shown)


def _positive(flag: str, value: float | None, *, most: float | None = None) -> None:
    """A finite number above 0 (and at most `most`), else a usage error naming the flag."""
    if value is None:
        return
    if not math.isfinite(value) or value <= 0 or (most is not None and value > most):
        limit = f" and at most {most:g}" if most is not None else ""
        fail(f"{flag} {value!r}: must be a number above 0{limit}")


def _read_input(source: str) -> str:
    """A log or test output as text: bounded, never a directory, never binary."""
    name = "standard input" if source == "-" else source
    try:
        if source == "-":
            data = sys.stdin.buffer.read(MAX_INPUT + 1)
        else:
            with Path(source).open("rb") as f:
                data = f.read(MAX_INPUT + 1)
    except IsADirectoryError:
        fail(f"{name}: is a directory, not a file")
    except OSError as e:
        fail(f"{name}: cannot read: {e.strerror or e}")
    if len(data) > MAX_INPUT:
        fail(f"{name}: larger than {MAX_INPUT >> 20} MiB; keep the NCCL and result lines")
    if b"\0" in data:
        fail(f"{name}: contains NUL bytes: binary data, not a text log")
    return data.decode("utf-8", errors="replace")


def _table(title: str, *columns: str, fold: bool = False) -> Table:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col, overflow="fold" if fold else "ellipsis")
    return table


def _findings_table(title: str, findings: list[Finding]) -> Table:
    table = _table(title, "check", "status", "detail", "fix", fold=True)
    for f in findings:
        style = _STYLE[f.status.name]
        table.add_row(
            safe(f.name), f"[{style}]{f.status.name}[/]", safe(f.detail), safe(f.fix or "")
        )
    return table


def _finish(kind: str, findings: list[Finding], output: str, extra: Mapping[str, Any]) -> NoReturn:
    from rdmaplane.cli.common import console
    from rdmaplane.services.doctor.policy.verdict import exit_code, jsonable, worst
    from rdmaplane.services.doctor.report import SCHEMA

    status = worst(f.status for f in findings)
    if output == "json":
        node = os.environ.get("NODE_NAME") or socket.gethostname()
        doc = {"schema": SCHEMA, "kind": kind, "status": status.name, "node": node, **extra}
        doc["findings"] = jsonable(findings)
        from rdmaplane.cli.output import write_text

        write_text(json.dumps(doc, default=str, indent=2, ensure_ascii=False) + "\n")
    else:
        console.print(_findings_table(kind, findings))
        console.print(f"[{_STYLE[status.name]}]{status.name}[/]")
    raise typer.Exit(exit_code(status))


def _root_dir(root: str) -> Path:
    """The --root folder; '' is refused (Path('') would be the working directory)."""
    if not root or not Path(root).is_dir():
        fail(f"--root {root or repr('')}: not a directory")
    if (Path(root) / "class").is_dir() and not (Path(root) / "sys").is_dir():
        fail(
            f"--root {root}: a sysfs tree (it holds class/, not sys/); --root is the root "
            "above sys/, dev/ and proc/ (lay a sample out with `rdmaplane samples materialize "
            f"NAME DIR/sys` and pass --root DIR; `rdmaplane inspect --sysfs-root {root}` reads "
            "this one)"
        )
    return Path(root)


@doctor_app.callback()
def run_checks(ctx: typer.Context, root: RootOption = None, output: OutputOption = None) -> None:
    """Check this pod (or host): RDMA devices (and the RDMA netns mode), ports, locked memory
    with IPC_LOCK, verbs libraries, NCCL variables against the hardware, GPU-NIC pairs,
    GPUDirect RDMA, /dev/shm."""
    if ctx.invoked_subcommand is not None:
        return  # the command takes the options (see _group_options)
    from rdmaplane.services.doctor import checks

    host = checks.Host(root=_root_dir("/" if root is None else root))
    node = checks.load(host)
    say_warnings(node.topo)
    findings = checks.run_all(host, node)
    extra = {"hostname": node.topo.hostname, "usable_hcas": [h.name for h in node.usable]}
    _finish("checks", findings, str(output or DoctorOutput.table), extra)


@doctor_app.command("nccl-tests")
def nccl_tests(
    ctx: typer.Context,
    file: Annotated[str, typer.Argument(metavar="FILE|-", help="nccl-tests output.")],
    line_rate: LineRateOption = None,
    threshold: Annotated[
        float, typer.Option(metavar="SHARE", help="Pass at this share of the aggregate.")
    ] = 0.8,
    root: RootOption = None,
    output: OutputOption = None,
) -> None:
    """Judge nccl-tests output (all_reduce_perf and the other collectives): peak and average
    busbw, #wrong, and the peak against one node's NIC aggregate (read below --root, unless
    --line-rate gives it) when the run spans nodes (a single-node run is SKIP: it measured
    NVLink/PCIe, not the NICs)."""
    from rdmaplane.services.doctor.policy import judge
    from rdmaplane.services.doctor.policy import parse_nccl_tests as parser
    from rdmaplane.services.doctor.policy.verdict import Finding, ParseError, Status

    host_root, output_kind = _group_options(ctx, "nccl-tests", root, output)
    _positive("--line-rate", line_rate)
    _positive("--threshold", threshold, most=1.0)
    try:
        result = parser.parse(_read_input(file))
    except ParseError as e:
        fail(f"{file}: {e}")
    aggregate, basis, notes = line_rate, "--line-rate" if line_rate else None, []
    if aggregate is None and (host_root / "sys/class/infiniband").is_dir():
        from rdmaplane.adapters.discovery import read_node

        topo = read_node(str(host_root / "sys"))
        say_warnings(topo)
        choice = judge.compute_hcas(topo, _env())
        aggregate = judge.aggregate_gbps(choice.hcas) or None
        basis = f"{choice.basis} at {host_root}"
        if choice.problem:
            notes.append(
                Finding(
                    "nccl-ib-hca",
                    Status.WARN,
                    f"{choice.problem}; judged against {choice.basis} instead",
                    "write NCCL_IB_HCA as name[:port],… naming HCAs of this node",
                )
            )
    findings = [*judge.judge_nccl_tests(result, aggregate, threshold, basis), *notes]
    extra = {
        "collective": result.collective,
        "hosts": list(result.hosts),
        "ranks": len(result.ranks),
        "peak_busbw_gbs": result.peak_busbw,
        "avg_busbw_gbs": result.avg_busbw,
        "wrong": result.wrong_total,
        "nic_aggregate_gbps": aggregate,
    }
    if output_kind == "table":
        from rdmaplane.cli.common import console

        console.print(
            f"{safe(result.collective or 'collective')}: {len(result.rows)} sizes, "
            f"{len(result.ranks) or '?'} ranks on {len(result.hosts) or '?'} host(s)"
        )
    _finish("nccl-tests", findings, output_kind, extra)


@doctor_app.command("nccl-log")
def nccl_log(
    ctx: typer.Context,
    file: Annotated[str, typer.Argument(metavar="FILE|-", help="NCCL_DEBUG=INFO output.")],
    output: OutputOption = None,
) -> None:
    """Say which transport NCCL used per rank (IB/RoCE or sockets), which HCAs, GPUDirect RDMA
    per channel and the GID index, and turn known failures into a cause and a fix (NCCL 2.4 to
    2.28 wordings)."""
    from rdmaplane.services.doctor.policy import judge
    from rdmaplane.services.doctor.policy import parse_nccl_log as parser
    from rdmaplane.services.doctor.policy.verdict import ParseError, jsonable

    _, output_kind = _group_options(ctx, "nccl-log", output=output)
    try:
        log = parser.parse(_read_input(file))
    except ParseError as e:
        fail(f"{file}: {e}")
    findings = judge.judge_nccl_log(log)
    if output_kind == "table":
        from rdmaplane.cli.common import console

        console.print(_ranks_table(log))
        for d in log.diagnoses:
            if d.line:
                console.print(f"line {d.line_no}: {safe(d.line)}", soft_wrap=True)
    extra = {
        "nccl_version": log.version,
        "nccl_versions": list(log.versions),
        "rdma_used": log.rdma_used,
        "ranks": jsonable(list(log.ranks)),
        "evidence": [
            {"name": d.finding.name, "line_no": d.line_no, "line": d.line}
            for d in log.diagnoses
            if d.line
        ],
    }
    _finish("nccl-log", findings, output_kind, extra)


def _ranks_table(log: parse_nccl_log.NcclLog) -> Table:
    table = _table(
        "transport per rank", "rank", "host", "gpu", "network", "HCAs", "GDR", "PXN", "GID index"
    )
    for r in log.ranks:
        table.add_row(
            str(r.rank) if r.rank >= 0 else "?",
            safe(r.host or "?"),
            "" if r.cuda_dev is None else str(r.cuda_dev),
            safe(r.network or "?"),
            safe(" ".join(r.hcas)),
            r.gdr,
            str(r.pxn_channels) if r.pxn_channels else "",
            ",".join(map(str, r.gid_indices)),
        )
    return table


@doctor_app.command("perf")
def perf_cmd(
    ctx: typer.Context,
    server: Annotated[bool, typer.Option("--server", help="Serve the pair test.")] = False,
    client: Annotated[
        str | None, typer.Option("--client", metavar="PEER", help="Run against PEER.")
    ] = None,
    hca: Annotated[
        list[str] | None,
        typer.Option(
            "--hca", metavar="NAME", help="HCA to test, repeatable [default: the pod's own]."
        ),
    ] = None,
    gid_index: Annotated[
        int | None,
        typer.Option("--gid-index", metavar="N", help="GID index [default: first RoCE v2 IPv4]."),
    ] = None,
    use_cuda: Annotated[
        int | None, typer.Option("--use-cuda", metavar="GPU", help="Buffers in this GPU.")
    ] = None,
    duration: Annotated[
        int, typer.Option(metavar="SECONDS", help="Seconds per bandwidth run (-D).")
    ] = 5,
    port: Annotated[
        int, typer.Option(metavar="PORT", help="First TCP port (perftest and the TCP stream).")
    ] = 18515,
    threshold: Annotated[
        float, typer.Option(metavar="SHARE", help="Pass at this share of line rate.")
    ] = 0.9,
    line_rate: LineRateOption = None,
    no_tcp: Annotated[bool, typer.Option("--no-tcp", help="Skip the TCP comparison.")] = False,
    timeout: Annotated[
        float,
        typer.Option(metavar="SECONDS", help="Seconds before a run, or the TCP leg, is abandoned."),
    ] = 120.0,
    root: RootOption = None,
    output: OutputOption = None,
) -> None:
    """Drive ib_write_bw and ib_write_lat per HCA between two pods (start --server first),
    judge bandwidth against the port's line rate, and compare with a TCP stream. Only HCAs this
    pod has /dev/infiniband device nodes for are tested."""
    import asyncio

    from rdmaplane.services.doctor import checks, perf

    host_root, output_kind = _group_options(ctx, "perf", root, output)
    if server == (client is not None):
        fail("give exactly one of --server and --client PEER")
    if client is not None and (not client or client.startswith("-") or _has_space(client)):
        fail(f"--client {client!r}: not a host name or address")
    _check_perf_flags(duration, port, timeout, threshold, line_rate, gid_index, use_cuda)
    host = checks.Host(root=host_root)
    node = checks.load(host)
    say_warnings(node.topo)
    if not node.usable:
        _finish("perf", [checks.devices(host, node)], output_kind, {"role": _role(client)})
    plan = perf.plan(
        node.topo,
        _env(),
        hcas=hca or None,
        gid_index=gid_index,
        usable={h.name for h in node.usable},
    )
    if port + 2 * len(plan.targets) > 65535:
        fail(f"--port {port}: {2 * len(plan.targets) + 1} ports from it pass 65535")
    options = perf.Options(
        duration=duration,
        base_port=port,
        use_cuda=use_cuda,
        tcp=not no_tcp,
        timeout=timeout,
        threshold=threshold,
        line_rate=line_rate,
    )
    try:
        with perf_progress(output_kind) as progress:
            if client is None:
                result = asyncio.run(perf.serve(plan.targets, options, progress))
            else:
                result = asyncio.run(perf.run_client(client, plan.targets, options, progress))
    except OSError as e:  # the TCP stream's port is taken or not ours to listen on
        fail(f"--port {port}: cannot listen for the TCP stream: {e.strerror or e}")
    if output_kind == "table":
        from rdmaplane.cli.common import console

        console.print(_perf_table(result))
        if result.tcp_gbps:
            console.print(f"TCP stream: {result.tcp_gbps:.2f} Gb/s")
    from rdmaplane.services.doctor.policy.verdict import jsonable

    _finish(
        "perf",
        [*plan.notes, *result.findings],
        output_kind,
        {"role": result.role, "runs": jsonable(result.runs), "tcp_gbps": result.tcp_gbps},
    )


def _has_space(text: str) -> bool:
    return any(c.isspace() for c in text)


def _role(client: str | None) -> str:
    return "server" if client is None else "client"


def _check_perf_flags(
    duration: int,
    port: int,
    timeout: float,
    threshold: float,
    line_rate: float | None,
    gid_index: int | None,
    use_cuda: int | None,
) -> None:
    if duration < 1:
        fail(f"--duration {duration}: must be at least 1 second")
    if not 1 <= port <= 65535:
        fail(f"--port {port}: must be a TCP port (1-65535)")
    _positive("--timeout", timeout)
    if timeout <= duration:
        fail(f"--timeout {timeout:g}: must exceed --duration {duration}")
    _positive("--threshold", threshold, most=1.0)
    _positive("--line-rate", line_rate)
    if gid_index is not None and gid_index < 0:
        fail(f"--gid-index {gid_index}: must be 0 or more")
    if use_cuda is not None and use_cuda < 0:
        fail(f"--use-cuda {use_cuda}: must be a GPU number (0 or more)")


def perf_progress(output: str) -> Any:
    """A rich progress bar on stderr; silent for -o json (machines read stdout)."""
    from rdmaplane.cli.common import err_console
    from rdmaplane.services.doctor import perf

    return perf.RichProgress(err_console, enabled=output == "table")


def _perf_table(result: perf.PerfResult) -> Table:
    columns = ("HCA", "port", "GID", "line rate", "write BW", "share", "latency")
    table = _table(f"perftest ({result.role})", *columns)
    for r in result.runs:
        share = f"{r.bw_gbps / r.line_rate_gbps:.0%}" if r.bw_gbps and r.line_rate_gbps else ""
        table.add_row(
            r.hca,
            str(r.port),
            "" if r.gid_index is None else str(r.gid_index),
            f"{r.line_rate_gbps:g} Gb/s" if r.line_rate_gbps else "?",
            f"{r.bw_gbps:.1f} Gb/s" if r.bw_gbps is not None else safe(r.error or ""),
            share,
            f"{r.lat_us:.2f} µs" if r.lat_us is not None else "",
        )
    return table


@doctor_app.command("job")
def job_cmd(
    ctx: typer.Context,
    nodes: Annotated[
        list[str], typer.Argument(metavar="NODE...", help="Nodes to validate (at least two).")
    ],
    image: Annotated[
        str, typer.Option(metavar="IMAGE", help="Image with rdmaplane and perftest.")
    ] = IMAGE,
    namespace: Annotated[
        str, typer.Option(metavar="NAMESPACE", help="Namespace of the Jobs.")
    ] = "rdmaplane-doctor",
    hcas: Annotated[int, typer.Option(metavar="N", help="RDMA devices per pod.")] = 1,
    resource: Annotated[
        str,
        typer.Option(
            metavar="NAME",
            help="The RDMA resource the pods request: an exclusive pool (a device is an HCA), "
            "or a shared pool (a device is a slot granting all its HCAs).",
        ),
    ] = HCA,
    duration: Annotated[
        int, typer.Option(metavar="SECONDS", help="Seconds per bandwidth run.")
    ] = 5,
    no_namespace: Annotated[
        bool,
        typer.Option(
            "--no-namespace",
            help="Leave the Namespace out (one managed elsewhere: it must admit IPC_LOCK).",
        ),
    ] = False,
) -> None:
    """Print the validation Jobs (YAML), their Namespace first (Pod Security level
    privileged: the pods add IPC_LOCK), for `| kubectl apply -f -`: node pairs that cover every
    node, each running the checks and the perf pair test; merge their logs with `rdmaplane
    doctor report`."""

    from rdmaplane.cli.common import err_console
    from rdmaplane.services.doctor.policy import pairing

    _group_options(ctx, "job")
    for node in nodes:
        if not _NODE_NAME.match(node):
            fail(f"node {node!r}: not a Kubernetes node name (lowercase DNS name)")
    if not _DNS_LABEL.match(namespace):
        fail(f"--namespace {namespace!r}: not a DNS label (lowercase, digits, '-')")
    if not image or _has_space(image):
        fail(f"--image {image!r}: not an image reference")
    if hcas < 1:
        fail(f"--hcas {hcas}: a pod needs at least 1 HCA")
    if not is_extended(resource):
        fail(f"--resource {resource!r}: not an extended resource name (domain/name)")
    if duration < 1:
        fail(f"--duration {duration}: must be at least 1 second")
    pairs = pairing.cover_pairs(nodes)
    docs = pairing.manifests(
        pairs, image=image, namespace=namespace, hcas=hcas, resource=resource, duration=duration
    )
    if not no_namespace:
        docs.insert(0, pairing.namespace_object(namespace))
    for p in pairs:
        err_console.print(f"# round {p.round}: {p.server} (server) ⇄ {p.client} (client)")
    write_yaml(docs)


@doctor_app.command("report")
def report_cmd(
    ctx: typer.Context,
    files: Annotated[list[str], typer.Argument(metavar="FILE|-...", help="`-o json` outputs.")],
    output: OutputOption = None,
) -> None:
    """Merge the `-o json` outputs of many pods (checks, perf) into one cluster report."""
    from rdmaplane.cli.common import console
    from rdmaplane.services.doctor import report
    from rdmaplane.services.doctor.policy.verdict import exit_code, jsonable

    _, output_kind = _group_options(ctx, "report", output=output)
    texts = [(f, _read_input(f)) for f in files]
    merged = report.merge(texts)
    if output_kind == "json":
        from rdmaplane.cli.output import write_json

        write_json(jsonable(merged))
    else:
        table = _table(
            "cluster report", "source", "node", "kind", "status", "failed checks", fold=True
        )
        for entry in merged.entries:
            table.add_row(
                safe(entry.source),
                safe(entry.node or "?"),
                safe(entry.kind),
                f"[{_STYLE[entry.status.name]}]{entry.status.name}[/]",
                safe("; ".join(entry.failed)),
            )
        console.print(table)
        console.print(f"[{_STYLE[merged.status.name]}]{merged.status.name}[/]")
    raise typer.Exit(exit_code(merged.status))


def _env() -> dict[str, str]:
    return dict(os.environ)
