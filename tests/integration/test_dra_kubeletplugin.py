"""The DRA driver's sockets as the kubelet meets them: registration as the plugin watcher
expects it, both API versions on one socket, sockets served again at once when a folder is
cleaned, and gone after stop. The claims side is a recording handler here; the real one, with
the API server, is in tests/e2e/test_dra_kubelet.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import pytest

from rdmaplane.adapters.supervisor import Supervisor
from rdmaplane.services.dra.grpc import DeviceHealth, HealthFeed, KubeletPlugin, Outcome
from rdmaplane.services.dra.policy.claims import ClaimRef, PreparedDevice
from tests.integration.dra_kubelet import Claim, DraKubelet, Prepared

DRIVER = "rdma.rdmaplane.io"


class Recorder:
    """Answers every claim with one device, or an error for names starting with `bad`."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[ClaimRef]]] = []

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Outcome]:
        self.calls.append(("prepare", list(claims)))
        return {
            c.uid: Outcome(error=f"claim {c}: bad")
            if c.name.startswith("bad")
            else Outcome((PreparedDevice(("nic",), "node", "pci-x-p1", (f"v/c={c.uid}",)),))
            for c in claims
        }

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        self.calls.append(("unprepare", list(claims)))
        return {c.uid: "" for c in claims}


@pytest.fixture
async def plugin(short_dir: Path) -> AsyncIterator[tuple[KubeletPlugin, Recorder, Path]]:
    recorder = Recorder()
    kubelet_dir = short_dir / "kubelet"
    served = KubeletPlugin(
        DRIVER,
        recorder,
        plugin_dir=kubelet_dir / "plugins" / DRIVER,
        registry_dir=kubelet_dir / "plugins_registry",
    )
    supervisor = Supervisor()
    await served.start(supervisor)
    yield served, recorder, kubelet_dir
    await served.stop()
    await supervisor.close()


async def test_registers_as_a_dra_plugin_and_answers_both_versions(
    plugin: tuple[KubeletPlugin, Recorder, Path],
) -> None:
    served, recorder, kubelet_dir = plugin
    kubelet = DraKubelet(kubelet_dir, DRIVER)
    info = await kubelet.register()
    assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, str(served.socket))
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert kubelet.service == "v1.DRAPlugin"
    assert served.registrations == 1

    good, bad = Claim("ns", "good", "u1"), Claim("ns", "bad", "u2")
    for service in ("v1.DRAPlugin", "v1beta1.DRAPlugin"):
        got = await kubelet.prepare([good, bad], service)
        assert got["u1"].error == "" and got["u1"].devices == (
            (("nic",), "node", "pci-x-p1", ("v/c=u1",)),
        )
        assert got["u2"] == Prepared((), "claim ns/bad: bad")
        assert await kubelet.unprepare([good], service) == {"u1": ""}
    assert [c for c, _ in recorder.calls] == ["prepare", "unprepare"] * 2
    await kubelet.close()


async def test_a_cleaned_folder_is_served_again_at_once(
    plugin: tuple[KubeletPlugin, Recorder, Path],
) -> None:
    served, _, kubelet_dir = plugin
    for socket in (served.socket, served.registration_socket):
        socket.unlink()
    kubelet = DraKubelet(kubelet_dir, DRIVER)
    await kubelet.register(within_s=10)  # inotify saw it: served again, well within the recheck
    assert (await kubelet.prepare([Claim("ns", "c", "u")]))["u"].error == ""
    assert not [p.name for p in served.socket.parent.iterdir() if p.name.startswith(".")]
    await kubelet.close()


async def test_stop_removes_the_sockets(short_dir: Path) -> None:
    kubelet_dir = short_dir / "kubelet"
    served = KubeletPlugin(
        DRIVER,
        Recorder(),
        plugin_dir=kubelet_dir / "plugins" / DRIVER,
        registry_dir=kubelet_dir / "plugins_registry",
    )
    supervisor = Supervisor()
    await served.start(supervisor)
    assert served.socket.exists() and served.registration_socket.exists()
    await served.stop()
    await supervisor.close()
    assert not served.socket.exists() and not served.registration_socket.exists()


async def test_the_health_stream_says_every_change_and_again_within_the_timeout(
    short_dir: Path,
) -> None:
    kubelet_dir = short_dir / "kubelet"
    feed = HealthFeed("node-a", timeout_s=30, resend_s=60)
    served = KubeletPlugin(
        DRIVER,
        Recorder(),
        plugin_dir=kubelet_dir / "plugins" / DRIVER,
        registry_dir=kubelet_dir / "plugins_registry",
        health=feed,
    )
    supervisor = Supervisor()
    await served.start(supervisor)
    kubelet = DraKubelet(kubelet_dir, DRIVER)
    info = await kubelet.register()
    assert list(info.supported_versions) == [
        "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth",
    ]  # fmt: skip
    assert kubelet.service == "v1.DRAPlugin" and kubelet.health_service == "v1.DRAResourceHealth"
    for service in ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"):
        feed.resend_s = 60.0  # a change is sent at once, not at the next resend
        feed.publish([DeviceHealth("pci-a-p1", True), DeviceHealth("pci-b-p1", True)])
        stream = kubelet.watch_health(service)
        first = await anext(stream)
        assert [(h.pool, h.device, h.health, h.timeout_s) for h in first] == [
            ("node-a", "pci-a-p1", "HEALTHY", 30),
            ("node-a", "pci-b-p1", "HEALTHY", 30),
        ]
        assert feed.streams >= 1
        long = "PortDown: " + "x" * 2000
        feed.publish([DeviceHealth("pci-a-p1", True), DeviceHealth("pci-b-p1", False, long)])
        changed = await asyncio.wait_for(anext(stream), 10)
        assert changed[1].health == "UNHEALTHY" and changed[1].message == long[:1024]
        await stream.aclose()

        feed.resend_s = 0.2  # nothing changes: the whole list again, well within the timeout
        stream = kubelet.watch_health(service)
        reports = [await asyncio.wait_for(anext(stream), 10) for _ in range(3)]
        assert all([h.health for h in r] == ["HEALTHY", "UNHEALTHY"] for r in reports)
        await stream.aclose()
    await kubelet.close()
    await served.stop()
    await supervisor.close()
