"""The perf pair runner end to end, against test-double perftest binaries on PATH.

The doubles (tests/doctor/doubles/perftest_double.py) only print perftest-format output after a
real TCP handshake between server and client; the planning, running, parsing, judging and the TCP
stream comparison are the real code.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rdmaplane.adapters.discovery.sysfs import read_node
from rdmaplane.services.doctor import perf
from rdmaplane.services.doctor.policy.verdict import Status

DOUBLE = Path(__file__).parent / "doubles" / "perftest_double.py"


@pytest.fixture
def doubles_on_path(tmp_path, monkeypatch):
    """ib_write_bw and ib_write_lat on PATH, both the double, run by this interpreter."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    body = DOUBLE.read_text().split("\n", 1)[1]
    for tool in ("ib_write_bw", "ib_write_lat"):
        exe = bin_dir / tool
        exe.write_text(f"#!{sys.executable}\n{body}")
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for var in ("DOUBLE_BW_GBPS", "DOUBLE_FAIL", "DOUBLE_LAT_US", "NCCL_IB_GID_INDEX"):
        monkeypatch.delenv(var, raising=False)
    return bin_dir


def free_ports(n: int) -> int:
    """A base port with n free ports above it."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        try:
            socks = []
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


@pytest.fixture(scope="module")
def roce_topo(sample_trees):
    return read_node(str(sample_trees["hgx-h100-roce"]))


def options(**kw) -> perf.Options:
    base = dict(duration=1, base_port=free_ports(8), timeout=30, retry_for=15)
    base.update(kw)
    return perf.Options(**base)


async def pair(targets, opts):
    return await asyncio.gather(
        perf.serve(targets, opts), perf.run_client("127.0.0.1", targets, opts)
    )


def test_pair_run_passes_near_line_rate(doubles_on_path, roce_topo):
    targets = perf.plan(roce_topo, {}, hcas=["mlx5_0", "mlx5_1"]).targets
    assert [(t.hca, t.gid_index, t.line_rate_gbps) for t in targets] == [
        ("mlx5_0", 3, 400.0),
        ("mlx5_1", 3, 400.0),
    ]
    server, client = asyncio.run(pair(targets, options()))
    for result in (server, client):
        assert [r.hca for r in result.runs] == ["mlx5_0", "mlx5_1"]
        assert all(r.bw_gbps == pytest.approx(392.4) for r in result.runs)
        assert all(r.lat_us == pytest.approx(1.76) for r in result.runs)
        assert result.tcp_gbps and result.tcp_gbps > 0
        assert {f.status for f in result.findings} == {Status.PASS}
    bw = next(f for f in client.findings if f.name == "bw mlx5_0")
    assert "392.4 Gb/s = 98% of 400 Gb/s line rate" in bw.detail
    assert "× TCP" in bw.detail
    assert client.role == "client" and server.role == "server"


def test_slow_hca_fails_against_line_rate(doubles_on_path, roce_topo, monkeypatch):
    monkeypatch.setenv("DOUBLE_BW_GBPS_mlx5_1", "300")
    targets = perf.plan(roce_topo, {}, hcas=["mlx5_0", "mlx5_1"]).targets
    _, client = asyncio.run(pair(targets, options(tcp=False)))
    by_name = {f.name: f for f in client.findings}
    assert by_name["bw mlx5_0"].status == Status.PASS
    assert by_name["bw mlx5_1"].status == Status.FAIL
    assert "75% of 400 Gb/s" in by_name["bw mlx5_1"].detail
    assert client.tcp_gbps is None


def test_failed_connection_reports_the_perftest_error(doubles_on_path, roce_topo, monkeypatch):
    monkeypatch.setenv("DOUBLE_FAIL", "mlx5_0")
    targets = perf.plan(roce_topo, {}, hcas=["mlx5_0"]).targets
    _, client = asyncio.run(pair(targets, options(tcp=False)))
    bw = next(f for f in client.findings if f.name == "bw mlx5_0")
    assert bw.status == Status.FAIL
    assert "Failed to modify QP" in bw.detail
    assert bw.fix and "GID index" in bw.fix


def test_client_without_server_gives_up(doubles_on_path, roce_topo):
    targets = perf.plan(roce_topo, {}, hcas=["mlx5_0"]).targets
    result = asyncio.run(perf.run_client("127.0.0.1", targets, options(tcp=False, retry_for=0.5)))
    assert result.findings[0].status == Status.FAIL
    assert "Couldn't connect" in result.findings[0].detail
    assert "start the server first" in (result.findings[0].fix or "")


def test_missing_perftest_is_said_once_with_a_fix(tmp_path, monkeypatch, roce_topo):
    monkeypatch.setenv("PATH", str(tmp_path))
    targets = perf.plan(roce_topo, {}, hcas=[f"mlx5_{i}" for i in range(8)]).targets
    result = asyncio.run(perf.run_client("127.0.0.1", targets, options(tcp=False)))
    (finding,) = result.findings
    assert finding.name == "perftest" and finding.status == Status.FAIL
    assert finding.detail == "ib_write_bw and ib_write_lat are not installed (perftest)"
    assert "apt-get install perftest" in (finding.fix or "")
    assert result.runs == ()


def test_tcp_leg_gives_up_after_the_timeout(roce_topo):
    """A peer that accepts the stream but never reads it (or never answers): the client's TCP
    leg ends after --timeout instead of hanging on a full socket buffer."""

    async def scenario() -> tuple[float | None, float]:
        async def silent(reader, writer):
            await asyncio.sleep(30)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        opts = perf.Options(duration=60, timeout=1.5, retry_for=1)
        start = time.monotonic()
        async with server:
            gbps = await perf.tcp_client("127.0.0.1", port, opts)
        return gbps, time.monotonic() - start

    gbps, elapsed = asyncio.run(scenario())
    assert gbps is None and elapsed < 30


def test_server_tcp_leg_gives_up_after_the_timeout():
    async def scenario() -> float | None:
        listener = await perf.tcp_listen(free_ports(1))
        return await perf.tcp_receive(listener, perf.Options(timeout=0.5))

    assert asyncio.run(scenario()) is None


def test_plan_defaults_and_errors(sample_nodes):
    roce = sample_nodes["hgx-h100-roce"]
    default = perf.plan(roce, {}).targets
    assert [t.hca for t in default] == [f"mlx5_{i}" for i in range(8)]  # compute NICs only
    assert perf.plan(roce, {"NCCL_IB_GID_INDEX": "2"}, hcas=["mlx5_0"]).targets[0].gid_index == 2
    assert perf.plan(roce, {}, hcas=["mlx5_0"], gid_index=5).targets[0].gid_index == 5
    ib = perf.plan(sample_nodes["hgx-h200-ib"], {}, hcas=["mlx5_10"]).targets
    assert ib[0].gid_index is None and ib[0].line_rate_gbps == 400.0
    with pytest.raises(perf.PerfPlanError, match="no such HCA"):
        perf.plan(roce, {}, hcas=["mlx5_42"])
    with pytest.raises(perf.PerfPlanError, match="no RoCE v2 IPv4 GID"):
        perf.plan(sample_nodes["degraded"], {}, hcas=["mlx5_3"])


def test_plan_tests_only_the_hcas_the_pod_has(sample_nodes):
    roce = sample_nodes["hgx-h100-roce"]
    assert [t.hca for t in perf.plan(roce, {}, usable={"mlx5_3", "mlx5_bond_0"}).targets] == [
        "mlx5_3"
    ]
    assert [t.hca for t in perf.plan(roce, {}, usable={"mlx5_bond_0"}).targets] == ["mlx5_bond_0"]
    with pytest.raises(perf.PerfPlanError, match="no HCA with an ACTIVE port"):
        perf.plan(roce, {}, usable=set())  # no device node at all: nothing, not everything
    with pytest.raises(perf.PerfPlanError, match="no /dev/infiniband device node for it"):
        perf.plan(roce, {}, hcas=["mlx5_5"], usable={"mlx5_3"})


def test_plan_says_when_nccl_ib_hca_is_unusable(sample_nodes):
    plan = perf.plan(sample_nodes["hgx-h100-roce"], {"NCCL_IB_HCA": "mlx5_0:x"}, usable={"mlx5_2"})
    assert [t.hca for t in plan.targets] == ["mlx5_2"]
    (note,) = plan.notes
    assert note.name == "nccl-ib-hca" and "malformed" in note.detail


def test_both_sides_run_the_same_command_but_the_peer():
    t = perf.Target("mlx5_0", 1, perf.LinkLayer.ETHERNET, 3, 400.0)
    o = perf.Options(use_cuda=2)
    server = perf.perftest_args("ib_write_bw", t, o, 18515, None)
    client = perf.perftest_args("ib_write_bw", t, o, 18515, "10.0.0.2")
    assert client == [*server, "10.0.0.2"]
    assert {"-x", "3", "--report_gbits", "--use_cuda=2"} <= set(server)


def test_cli_pair_end_to_end(doubles_on_path, sample_trees, tmp_path):
    """Two `rdmaplane doctor perf` processes, server and client, as in two pods."""
    pod_with(tmp_path, sample_trees["hgx-h100-roce"], ["uverbs0"])
    base = str(free_ports(4))
    common = [
        "--root",
        str(tmp_path),
        "--hca",
        "mlx5_0",
        "--port",
        base,
        "--duration",
        "1",
        "-o",
        "json",
    ]
    exe = [sys.executable, "-m", "rdmaplane", "doctor", "perf"]
    server = subprocess.Popen([*exe, "--server", *common], stdout=subprocess.PIPE, text=True)
    try:
        client = subprocess.run(
            [*exe, "--client", "127.0.0.1", *common], capture_output=True, text=True, timeout=120
        )
        out, _ = server.communicate(timeout=60)
    finally:
        server.kill()
    assert client.returncode == 0, client.stderr
    doc = json.loads(client.stdout)
    assert doc["schema"] == "rdmaplane.io/doctor/v1" and doc["kind"] == "perf"
    assert doc["status"] == "PASS" and doc["runs"][0]["bw_gbps"] == pytest.approx(392.4)
    assert doc["tcp_gbps"] > 0
    assert server.returncode == 0
    assert json.loads(out)["role"] == "server"


def pod_with(root: Path, sys_tree: Path, uverbs: list[str]) -> Path:
    (root / "sys").symlink_to(sys_tree)
    (root / "dev/infiniband").mkdir(parents=True)
    for name in [*uverbs, "rdma_cm"]:
        (root / "dev/infiniband" / name).touch()
    return root


def doctor_perf(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    exe = [sys.executable, "-m", "rdmaplane", "doctor", "perf"]
    return subprocess.run([*exe, *args], capture_output=True, text=True, timeout=120, env=env)


def test_cli_pod_without_device_nodes_fails_with_the_reason(sample_trees, tmp_path):
    pod_with(tmp_path, sample_trees["hgx-h100-roce"], [])
    done = doctor_perf("--client", "127.0.0.1", "--root", str(tmp_path), "-o", "json")
    doc = json.loads(done.stdout)
    assert done.returncode == 1 and doc["findings"][0]["name"] == "rdma-devices"
    assert "no /dev/infiniband/uverbsN" in doc["findings"][0]["detail"]


def test_cli_without_perftest_says_so_once(sample_trees, tmp_path):
    pod_with(tmp_path, sample_trees["hgx-h100-roce"], ["uverbs0", "uverbs1", "uverbs2"])
    env = {**os.environ, "PATH": str(tmp_path)}
    done = doctor_perf(
        "--client", "127.0.0.1", "--root", str(tmp_path), "--no-tcp", "-o", "json", env=env
    )
    doc = json.loads(done.stdout)
    assert done.returncode == 1
    assert [f["detail"] for f in doc["findings"]] == [
        "ib_write_bw and ib_write_lat are not installed (perftest)"
    ]


def test_cli_server_port_taken_is_one_line(sample_trees, tmp_path, doubles_on_path):
    pod_with(tmp_path, sample_trees["hgx-h100-roce"], ["uverbs0"])
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        base = taken.getsockname()[1] - 2  # the TCP stream's port is base + 2·1
        done = doctor_perf(
            "--server",
            "--root",
            str(tmp_path),
            "--hca",
            "mlx5_0",
            "--port",
            str(base),
            "--timeout",
            "5",
            "--duration",
            "1",
        )
    assert done.returncode == 2 and "cannot listen for the TCP stream" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_cli_usage_errors(sample_trees, tmp_path):
    exe = [sys.executable, "-m", "rdmaplane", "doctor", "perf"]
    both = subprocess.run([*exe, "--server", "--client", "x"], capture_output=True, text=True)
    assert both.returncode == 2 and "exactly one" in both.stderr
