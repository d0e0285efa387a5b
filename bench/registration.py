#!/usr/bin/env python3
"""Registration through a storm of kubelet restarts: registrations per kubelet life and the delay.

The kubelet stand-in of tests/integration/kubelet_process.py (a process of its own, speaking the
kubelet's protocols from the generated stubs) restarts as a fast kubelet does: its server stops,
every file in `device-plugins/` is deleted, a new `kubelet.sock` listens at once. Between two
restarts it lives 0 s one time in ten, else uniform in [0, 1) s times `--scale`. Against it:
the device plugin (one pool, `kubelet` registration: it calls Register) and the DRA driver
(the kubelet's plugin watcher registers it; `--wipe-registry` of the restarts also delete its
registration socket, so the driver must serve it again). Both run in this process, their safety
rechecks at an hour: every registration is driven by inotify.

Printed per component: restarts, how many kubelet lives saw 0 / 1 / 2+ registrations (a life
shorter than `--within` ms may see none: the next must), the delay from the kubelet listening to
its registration (p50, p99, worst), registrations refused as "already connected", and the
problems found by the same verdict as tests/integration/test_registration_storm.py.

    PYTHONPATH=src:. python bench/registration.py --restarts 500 --scale 1.0
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "integration"))  # the stand-in and the storm

from kubelet_process import KubeletProcess  # noqa: E402
from kubelet_standin import device_nodes  # noqa: E402
from restart_storm import Storm, storm  # noqa: E402

from rdmaplane.adapters.discovery import read_node, samples  # noqa: E402
from rdmaplane.adapters.supervisor import Supervisor  # noqa: E402
from rdmaplane.core.settings.deviceplugin import PluginSettings  # noqa: E402
from rdmaplane.services.deviceplugin import RdmaDevicePlugin  # noqa: E402
from rdmaplane.services.dra.grpc import KubeletPlugin, Outcome  # noqa: E402
from rdmaplane.services.dra.policy.claims import ClaimRef  # noqa: E402

HOUR = 3600.0
DRIVER = "rdma.rdmaplane.io"


class NoClaims:
    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Outcome]:
        return {}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        return {}


async def device_plugin(base: Path, args: argparse.Namespace) -> Storm:
    sysfs = base / "sys"
    samples.build(samples.load("hgx-h100-roce").spec, sysfs)
    kdir = base / "k"
    kdir.mkdir()
    plugin = RdmaDevicePlugin(
        PluginSettings(),
        kubelet_dir=kdir,
        dev_root=str(device_nodes(sysfs, base / "dev")),
        recheck_interval=HOUR,
    )
    plugin.update(read_node(str(sysfs)))
    async with KubeletProcess(kdir) as kubelet:
        await plugin.start()
        try:
            await kubelet.registered(30)
            return await storm(
                kubelet,
                "rdmaplane.io/hca",
                args.restarts,
                seed=args.seed,
                scale=args.scale,
                within_s=args.within / 1000,
            )
        finally:
            await plugin.stop()


async def dra_driver(base: Path, args: argparse.Namespace) -> Storm:
    kdir = base / "d"
    plugin = KubeletPlugin(
        DRIVER,
        NoClaims(),
        plugin_dir=kdir / "plugins" / DRIVER,
        registry_dir=kdir / "plugins_registry",
        recheck_s=HOUR,
    )
    supervisor = Supervisor()
    async with KubeletProcess(kdir, plugins_registry=True) as kubelet:
        await plugin.start(supervisor)
        try:
            await kubelet.registered_dra(30)
            return await storm(
                kubelet,
                DRIVER,
                args.restarts,
                seed=args.seed + 1,
                scale=args.scale,
                wipe_registry=args.wipe_registry,
                within_s=args.within / 1000,
            )
        finally:
            await plugin.stop()
            await supervisor.close()


async def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.ERROR)
    base = Path(tempfile.mkdtemp(prefix="rp-"))  # unix socket paths are short
    print(
        f"{args.restarts} restarts each, intervals 0 (1 in 10) or U[0,1) s x {args.scale}, "
        f"registration within {args.within:g} ms"
    )
    problems = 0
    for name, run in (("device plugin", device_plugin), ("DRA driver", dra_driver)):
        if args.only and args.only != name.split()[0].lower():
            continue
        started = time.monotonic()
        seen = await run(base, args)
        print(f"{name} ({time.monotonic() - started:.0f} s): {seen.summary()}")
        for problem in seen.problems():
            print(f"  problem: {problem}")
        problems += len(seen.problems())
    return 1 if problems else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--restarts", type=int, default=500)
    parser.add_argument("--scale", type=float, default=0.2, help="interval scale (1.0: 0-1 s)")
    parser.add_argument("--within", type=float, default=300.0, help="ms")
    parser.add_argument("--wipe-registry", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--only", choices=["device", "dra"])
    sys.exit(asyncio.run(main(parser.parse_args())))
