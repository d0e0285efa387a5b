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
from pathlib import Path

import pytest

from rdmaplane.discovery.sysfs import read_node
from rdmaplane.doctor import perf
from rdmaplane.doctor.verdict import Status

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
    targets = perf.plan(roce_topo, {}, hcas=["mlx5_0", "mlx5_1"])
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
    targets = perf.plan(roce_topo, {}, hcas=["mlx5_0", "mlx5_1"])
    _, client = asyncio.run(pair(targets, options(tcp=False)))
    by_name = {f.name: f for f in client.findings}
    assert by_name["bw mlx5_0"].status == Status.PASS
    assert by_name["bw mlx5_1"].status == Status.FAIL
    assert "75% of 400 Gb/s" in by_name["bw mlx5_1"].detail
    assert client.tcp_gbps is None


def test_failed_connection_reports_the_perftest_error(doubles_on_path, roce_topo, monkeypatch):
    monkeypatch.setenv("DOUBLE_FAIL", "mlx5_0")
    targets = perf.plan(roce_topo, {}, hcas=["mlx5_0"])
    _, client = asyncio.run(pair(targets, options(tcp=False)))
    bw = next(f for f in client.findings if f.name == "bw mlx5_0")
    assert bw.status == Status.FAIL
    assert "Failed to modify QP" in bw.detail
    assert bw.fix and "GID index" in bw.fix


def test_client_without_server_gives_up(doubles_on_path, roce_topo):
    targets = perf.plan(roce_topo, {}, hcas=["mlx5_0"])
    result = asyncio.run(perf.run_client("127.0.0.1", targets, options(tcp=False, retry_for=0.5)))
    assert result.findings[0].status == Status.FAIL
    assert "Couldn't connect" in result.findings[0].detail
    assert "start the server first" in (result.findings[0].fix or "")


def test_missing_perftest(tmp_path, monkeypatch, roce_topo):
    monkeypatch.setenv("PATH", str(tmp_path))
    targets = perf.plan(roce_topo, {}, hcas=["mlx5_0"])
    result = asyncio.run(perf.run_client("127.0.0.1", targets, options(tcp=False)))
    assert "not found on PATH" in result.findings[0].detail


def test_plan_defaults_and_errors(sample_nodes):
    roce = sample_nodes["hgx-h100-roce"]
    default = perf.plan(roce, {})
    assert [t.hca for t in default] == [f"mlx5_{i}" for i in range(8)]  # compute NICs only
    assert perf.plan(roce, {"NCCL_IB_GID_INDEX": "2"}, hcas=["mlx5_0"])[0].gid_index == 2
    assert perf.plan(roce, {}, hcas=["mlx5_0"], gid_index=5)[0].gid_index == 5
    assert [t.hca for t in perf.plan(roce, {}, usable={"mlx5_3", "mlx5_bond_0"})] == ["mlx5_3"]
    assert [t.hca for t in perf.plan(roce, {}, usable={"mlx5_bond_0"})] == ["mlx5_bond_0"]
    ib = perf.plan(sample_nodes["hgx-h200-ib"], {}, hcas=["mlx5_10"])
    assert ib[0].gid_index is None and ib[0].line_rate_gbps == 400.0
    with pytest.raises(perf.PlanError, match="no such HCA"):
        perf.plan(roce, {}, hcas=["mlx5_42"])
    with pytest.raises(perf.PlanError, match="no RoCE v2 IPv4 GID"):
        perf.plan(sample_nodes["degraded"], {}, hcas=["mlx5_3"])


def test_both_sides_run_the_same_command_but_the_peer():
    t = perf.Target("mlx5_0", 1, perf.LinkLayer.ETHERNET, 3, 400.0)
    o = perf.Options(use_cuda=2)
    server = perf.perftest_args("ib_write_bw", t, o, 18515, None)
    client = perf.perftest_args("ib_write_bw", t, o, 18515, "10.0.0.2")
    assert client == [*server, "10.0.0.2"]
    assert {"-x", "3", "--report_gbits", "--use_cuda=2"} <= set(server)


def test_cli_pair_end_to_end(doubles_on_path, sample_trees, tmp_path):
    """Two `rdmaplane doctor perf` processes, server and client, as in two pods."""
    (tmp_path / "sys").symlink_to(sample_trees["hgx-h100-roce"])
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


def test_cli_usage_errors(sample_trees, tmp_path):
    exe = [sys.executable, "-m", "rdmaplane", "doctor", "perf"]
    both = subprocess.run([*exe, "--server", "--client", "x"], capture_output=True, text=True)
    assert both.returncode == 2 and "exactly one" in both.stderr
