"""/debug/* of the extender (rdmaplane.services.scheduler.debugaccess, as `rdmaplane
scheduler-extender`
serves the app): loopback clients only unless --debug-remote; everything else passes through.
The peer address is what uvicorn puts in the ASGI scope, set here through httpx's ASGI
transport; over a real socket on loopback it is 127.0.0.1."""

from __future__ import annotations

import ipaddress

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.types import ASGIApp

from rdmaplane.core.settings.scheduler import ExtenderSettings
from rdmaplane.services.scheduler.debugaccess import LoopbackDebug, is_loopback
from rdmaplane.services.scheduler.root import create_app, scheduler_calls_first
from tests.scheduler_helpers import example_cluster, pod, serve

LOCAL = ["127.0.0.1", "127.3.0.9", "::1", "::ffff:127.0.0.1"]
REMOTE = ["10.0.0.5", "192.0.2.7", "fd00::1", "::ffff:10.0.0.5"]
FILTER = {"Pod": pod("p", 1, 1), "NodeNames": ["paired"]}


async def _get(app: ASGIApp, client: str, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, client=(client, 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://extender") as http:
        if path in ("/filter", "/prioritize", "/debug/explain"):
            return await http.post(path, json=FILTER)
        return await http.get(path)


def _served(remote: bool) -> ASGIApp:
    """The app as the CLI serves it: kube-scheduler's calls first, then LoopbackDebug."""
    app = create_app(example_cluster(), ExtenderSettings())
    return scheduler_calls_first(app, LoopbackDebug(app, remote=remote))


@pytest.mark.parametrize("client", LOCAL)
async def test_debug_answers_loopback(client: str) -> None:
    assert (await _get(_served(False), client, "/debug/nodes/paired")).status_code == 200


@pytest.mark.parametrize("client", REMOTE)
async def test_debug_refuses_other_clients_unless_remote(client: str) -> None:
    refused = await _get(_served(False), client, "/debug/nodes/paired")
    assert refused.status_code == 403 and "--debug-remote" in refused.json()["Error"]
    assert (await _get(_served(False), client, "/debug/explain")).status_code == 403
    assert (await _get(_served(True), client, "/debug/nodes/paired")).status_code == 200
    assert (await _get(_served(True), client, "/debug/explain")).status_code == 200
    for path in ("/filter", "/prioritize", "/healthz", "/metrics"):  # kube-scheduler, Prometheus
        assert (await _get(_served(False), client, path)).status_code == 200, path


def test_over_a_real_socket_loopback_is_local() -> None:
    with serve(_served(False)) as url:
        assert httpx.get(f"{url}/debug/nodes/paired").status_code == 200


@given(st.ip_addresses())
def test_is_loopback_is_the_loopback_ranges(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    expected = (
        address in ipaddress.ip_network("127.0.0.0/8")
        if address.version == 4
        else (address == ipaddress.ip_address("::1") or (mapped is not None and mapped.is_loopback))
    )
    assert is_loopback((str(address), 1)) == expected


def test_no_peer_or_no_address_is_not_local() -> None:
    assert not is_loopback(None) and not is_loopback(("localhost", 1))
