"""The perftest pair run: `ib_write_bw` and `ib_write_lat` per HCA, plus a TCP stream to compare.

Both sides compute the same plan from their own node (HCA, port, GID index) and use one TCP port
per test: `base + 2·i` for bandwidth and `base + 2·i + 1` for latency of the i-th HCA, and
`base + 2·n` for the TCP stream. The server runs each perftest server in turn; the client retries
a run whose connection was refused (its server is not listening yet), so neither side needs a
control channel beyond the ones perftest and the stream already open.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

from rdmaplane.core.errors import InputError
from rdmaplane.core.gid import select_gid
from rdmaplane.core.model import Hca, LinkLayer, NodeTopology
from rdmaplane.services.doctor.policy import failures, judge, parse_perftest
from rdmaplane.services.doctor.policy.verdict import Finding, ParseError, Status

CONNECT_REFUSED = ("Couldn't connect to", "Unable to open file descriptor for socket connection")
TCP_CHUNK = 1 << 20


class PerfPlanError(InputError):
    """The node cannot run the perftest as asked (unknown HCA, no usable GID)."""


@dataclass(frozen=True, slots=True)
class Target:
    hca: str
    port: int
    link_layer: LinkLayer
    gid_index: int | None  # None on InfiniBand ports (perftest uses the LID)
    line_rate_gbps: float | None


@dataclass(frozen=True, slots=True)
class Options:
    duration: int = 5
    base_port: int = 18515
    use_cuda: int | None = None
    tcp: bool = True
    timeout: float = 120.0
    threshold: float = judge.BW_PASS
    line_rate: float | None = None  # overrides every port's rate
    retry_for: float = 30.0  # how long a client retries a refused connection


@dataclass(frozen=True, slots=True)
class Run:
    hca: str
    port: int
    gid_index: int | None
    line_rate_gbps: float | None
    bw_gbps: float | None
    lat_us: float | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class PerfResult:
    role: str
    runs: tuple[Run, ...]
    tcp_gbps: float | None
    findings: list[Finding] = field(default_factory=list)


class Progress(Protocol):
    def start(self, total: int) -> None: ...
    def step(self, description: str) -> None: ...
    def advance(self) -> None: ...


class NoProgress:
    def start(self, total: int) -> None:
        pass

    def step(self, description: str) -> None:
        pass

    def advance(self) -> None:
        pass


class RichProgress:
    """A rich progress bar (on the console given); a no-op when disabled."""

    def __init__(self, console: Any, enabled: bool = True) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.enabled = enabled
        self._bar = Progress(
            TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console
        )
        self._task: Any = None

    def __enter__(self) -> RichProgress:
        if self.enabled:
            self._bar.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.enabled:
            self._bar.stop()

    def start(self, total: int) -> None:
        if self.enabled:
            self._task = self._bar.add_task("starting", total=total)

    def step(self, description: str) -> None:
        if self.enabled and self._task is not None:
            self._bar.update(self._task, description=description)

    def advance(self) -> None:
        if self.enabled and self._task is not None:
            self._bar.advance(self._task)


# ---------------------------------------------------------------------------- the plan


@dataclass(frozen=True, slots=True)
class Plan:
    targets: list[Target]
    notes: list[Finding]  # what the reader must know about how the HCAs were chosen


def plan(
    topo: NodeTopology,
    env: Mapping[str, str],
    *,
    hcas: list[str] | None = None,
    gid_index: int | None = None,
    usable: set[str] | None = None,
) -> Plan:
    """The HCAs to test with port and GID index: those given, else the compute NICs among the
    `usable` ones (the HCAs this pod has device nodes for; None = no such limit)."""
    notes: list[Finding] = []
    if hcas:
        chosen = [_given(topo, name, usable) for name in hcas]
    else:
        choice = judge.compute_hcas(topo, env)
        if choice.problem:
            notes.append(
                Finding(
                    "nccl-ib-hca",
                    Status.WARN,
                    f"{choice.problem}; testing {choice.basis} instead",
                    "write NCCL_IB_HCA as name[:port],… naming HCAs this pod has",
                )
            )
        chosen = choice.hcas
        if usable is not None:
            mine = [h for h in topo.hcas if h.name in usable and any(p.is_up for p in h.ports)]
            chosen = [h for h in chosen if h.name in usable] or mine
    if not chosen:
        raise PerfPlanError("no HCA with an ACTIVE port to test")
    env_index = env.get("NCCL_IB_GID_INDEX", "").strip()
    wanted = gid_index if gid_index is not None else _int(env_index)
    return Plan([_target(hca, wanted) for hca in chosen], notes)


def _given(topo: NodeTopology, name: str, usable: set[str] | None) -> Hca:
    hca = topo.hca(name)
    if hca is None:
        known = ", ".join(h.name for h in topo.hcas) or "none"
        raise PerfPlanError(f"--hca {name}: no such HCA (have: {known})")
    if usable is not None and name not in usable:
        raise PerfPlanError(f"--hca {name}: this pod has no /dev/infiniband device node for it")
    return hca


def _target(hca: Hca, wanted: int | None) -> Target:
    port = next((p for p in hca.ports if p.is_up), hca.ports[0] if hca.ports else None)
    if port is None:
        raise PerfPlanError(f"{hca.name} has no port")
    index: int | None = None
    if port.link_layer == LinkLayer.ETHERNET:
        index = wanted if wanted is not None and wanted >= 0 else select_gid(hca, port).index
        if index is None:
            raise PerfPlanError(f"{hca.name}:{port.number} has no RoCE v2 IPv4 GID")
    return Target(hca.name, port.number, port.link_layer, index, port.rate_gbps)


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def perftest_args(
    tool: str, target: Target, options: Options, tcp_port: int, peer: str | None
) -> list[str]:
    """The command line; server and client must agree on everything but the peer."""
    args = [tool, "-d", target.hca, "-i", str(target.port), "-p", str(tcp_port), "-F"]
    if target.gid_index is not None:
        args += ["-x", str(target.gid_index)]
    if tool.endswith("_bw"):
        args += ["--report_gbits", "-D", str(options.duration), "-s", "1048576", "-q", "4"]
    else:
        args += ["-s", "2", "-n", "5000"]
    if options.use_cuda is not None:
        args.append(f"--use_cuda={options.use_cuda}")
    if peer is not None:
        args.append(peer)
    return args


# ---------------------------------------------------------------------------- running


@dataclass(frozen=True, slots=True)
class Completed:
    returncode: int
    output: str


async def run_tool(args: list[str], limit_s: float) -> Completed:
    """Run one perftest binary; its stdout and stderr together, as people see them."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
    except FileNotFoundError:
        return Completed(127, f"{args[0]}: not found on PATH (install perftest in the image)")
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), limit_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return Completed(124, f"{args[0]}: no result after {limit_s:g} s (peer not running?)")
    return Completed(proc.returncode or 0, out.decode(errors="replace"))


async def _client_tool(args: list[str], options: Options) -> Completed:
    """Retry while the server side is not listening yet."""
    deadline = time.monotonic() + options.retry_for
    while True:
        done = await run_tool(args, options.timeout)
        refused = done.returncode != 0 and any(m in done.output for m in CONNECT_REFUSED)
        if not refused or time.monotonic() > deadline:
            return done
        await asyncio.sleep(0.3)


PERFTEST_TOOLS = ("ib_write_bw", "ib_write_lat")


def missing_perftest(which: Callable[[str], str | None] = shutil.which) -> Finding | None:
    """One finding when perftest's binaries are not on PATH (instead of one per run)."""
    missing = [tool for tool in PERFTEST_TOOLS if which(tool) is None]
    if not missing:
        return None
    return Finding(
        "perftest",
        Status.FAIL,
        f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed (perftest)",
        "install perftest in the image (`apt-get install perftest`, `dnf install perftest`) "
        "or use rdmaplane's own image (the Dockerfile, `make image`)",
    )


async def serve(
    targets: list[Target], options: Options, progress: Progress | None = None
) -> PerfResult:
    progress = progress or NoProgress()
    listener = await tcp_listen(options.base_port + 2 * len(targets)) if options.tcp else None

    async def tool(args: list[str]) -> Completed:
        return await run_tool(args, options.timeout)

    runs, missing = await _perftest_runs(targets, options, progress, None, tool)
    tcp_gbps = await tcp_receive(listener, options) if listener else None
    return _result("server", runs, tcp_gbps, options, missing)


async def run_client(
    peer: str, targets: list[Target], options: Options, progress: Progress | None = None
) -> PerfResult:
    progress = progress or NoProgress()

    async def tool(args: list[str]) -> Completed:
        return await _client_tool(args, options)

    runs, missing = await _perftest_runs(targets, options, progress, peer, tool)
    tcp_gbps = None
    if options.tcp:
        progress.step(f"TCP stream → {peer} ({options.duration} s)")
        tcp_gbps = await tcp_client(peer, options.base_port + 2 * len(targets), options)
        progress.advance()
    return _result("client", runs, tcp_gbps, options, missing)


async def _perftest_runs(
    targets: list[Target],
    options: Options,
    progress: Progress,
    peer: str | None,
    tool: Callable[[list[str]], Awaitable[Completed]],
) -> tuple[list[Run], Finding | None]:
    """ib_write_bw then ib_write_lat per target, or nothing when perftest is missing."""
    missing = missing_perftest()
    steps = 0 if missing else 2 * len(targets)
    progress.start(steps + (1 if options.tcp and peer else 0))
    if missing:
        return [], missing
    runs = []
    to = f" → {peer}" if peer else " server"
    for i, t in enumerate(targets):
        progress.step(f"{t.hca}: ib_write_bw{to} ({options.duration} s)")
        bw = await tool(perftest_args("ib_write_bw", t, options, _port(options, i, 0), peer))
        progress.advance()
        progress.step(f"{t.hca}: ib_write_lat{to}")
        lat = await tool(perftest_args("ib_write_lat", t, options, _port(options, i, 1), peer))
        progress.advance()
        runs.append(_run(t, bw, lat))
    return runs, missing


def _port(options: Options, i: int, which: int) -> int:
    return options.base_port + 2 * i + which


def _run(t: Target, bw: Completed, lat: Completed) -> Run:
    errors = []
    bw_gbps = lat_us = None
    try:
        bw_gbps = parse_perftest.parse_bw(bw.output).best_average_gbps
    except ParseError as e:
        errors.append(f"ib_write_bw: {e}")
    try:
        lat_us = parse_perftest.parse_lat(lat.output).typical_us
    except ParseError as e:
        errors.append(f"ib_write_lat: {e}")
    return Run(
        t.hca, t.port, t.gid_index, t.line_rate_gbps, bw_gbps, lat_us, "; ".join(errors) or None
    )


def _result(
    role: str,
    runs: list[Run],
    tcp_gbps: float | None,
    options: Options,
    missing: Finding | None,
) -> PerfResult:
    findings = [missing] if missing else []
    for r in runs:
        rate = options.line_rate or r.line_rate_gbps
        if r.bw_gbps is None:
            findings.append(
                Finding(f"bw {r.hca}", Status.FAIL, r.error or "no result", _failure_fix(r.error))
            )
            continue
        f = judge.judge_bw_figure(r.hca, r.bw_gbps, rate, options.threshold)
        if tcp_gbps:
            f = Finding(
                f.name, f.status, f"{f.detail}; RDMA {r.bw_gbps / tcp_gbps:.1f}× TCP", f.fix
            )
        findings.append(f)
        if r.lat_us is None:
            findings.append(Finding(f"lat {r.hca}", Status.WARN, r.error or "no latency result"))
        else:
            findings.append(Finding(f"lat {r.hca}", Status.PASS, f"{r.lat_us:.2f} µs (2 B write)"))
    if options.tcp and tcp_gbps is None:
        findings.append(
            Finding(
                "tcp",
                Status.WARN,
                "the TCP stream did not complete",
                "check that the peer's TCP port is reachable",
            )
        )
    return PerfResult(role, tuple(runs), tcp_gbps, findings)


def _failure_fix(error: str | None) -> str | None:
    known = parse_perftest.diagnose_failure(error or "")
    if known is None:
        return None
    if known.status is None:
        return known.fix
    return failures.completion_finding(known.status).fix


# ---------------------------------------------------------------------------- TCP stream


async def tcp_listen(port: int) -> tuple[asyncio.Server, asyncio.Future[float]]:
    """Listen for one stream; the future gets the Gb/s it arrived at, after answering the
    sender with the byte count. Listening starts early, so the peer may connect whenever."""
    done: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        start = time.monotonic()
        total = 0
        while chunk := await reader.read(TCP_CHUNK):
            total += len(chunk)
        elapsed = time.monotonic() - start
        writer.write(f"{total}\n".encode())
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()
        if not done.done():
            done.set_result(total * 8 / max(elapsed, 1e-9) / 1e9)

    server = await asyncio.start_server(handle, host=None, port=port, reuse_address=True)
    return server, done


async def tcp_receive(
    listener: tuple[asyncio.Server, asyncio.Future[float]], options: Options
) -> float | None:
    """Wait at most --timeout for the stream (the TCP leg starts when the perftest runs end)."""
    server, done = listener
    try:
        return await asyncio.wait_for(done, options.timeout)
    except TimeoutError:
        return None
    finally:
        server.close()


async def tcp_client(peer: str, port: int, options: Options) -> float | None:
    """Send for `duration` seconds; Gb/s from the byte count the server confirms. The whole
    leg (connecting, sending, the answer) gives up after --timeout."""
    try:
        return await asyncio.wait_for(_tcp_send(peer, port, options), options.timeout)
    except (OSError, TimeoutError):
        return None


async def _tcp_send(peer: str, port: int, options: Options) -> float | None:
    deadline = time.monotonic() + options.retry_for
    while True:
        try:
            reader, writer = await asyncio.open_connection(peer, port)
            break
        except OSError:
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.3)
    payload = bytes(TCP_CHUNK)
    start = time.monotonic()
    try:
        while time.monotonic() - start < options.duration:
            writer.write(payload)
            await writer.drain()
        writer.write_eof()
        line = await reader.readline()
        elapsed = time.monotonic() - start
    finally:
        writer.close()
    try:
        confirmed = int(line)
    except ValueError:
        return None
    return confirmed * 8 / max(elapsed, 1e-9) / 1e9
