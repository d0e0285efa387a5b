"""`python3 -m image lock | layers DIR | oci ARCHIVE`: the image's lock, its layers, its archive."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from image import build, deb, debian, dockerfile, fetch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m image",
        description="Build rdmaplane's image from Debian's packages and PyPI's wheels, "
        "no registry needed (docs/image.md).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("lock", help="resolve image/packages.txt into image/debian.lock")
    layers = commands.add_parser(
        "layers", help="the Dockerfile's build stage: one folder per layer"
    )
    layers.add_argument("out", type=Path, help="the folder to write the layers' folders into")
    archive = commands.add_parser(
        "oci", help="the image as an OCI archive (what `make image` runs)"
    )
    archive.add_argument("out", type=Path, help="the archive to write, e.g. dist/rdmaplane.oci.tar")
    archive.add_argument(
        "--uncompressed",
        action="store_true",
        help="store the layers as plain tars (faster to write)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        if args.command == "lock":
            made = build.lock()
            print(f"{build.LOCK.relative_to(build.REPO)}: {len(made.packages)} packages")
        elif args.command == "layers":
            build.layers_command(args.out)
        else:
            written = build.archive_command(args.out, compress=not args.uncompressed)
            stored = sum(written.layer_sizes)
            print(
                f"{args.out}: {written.name} {written.manifest} "
                f"({stored / 1e6:.1f} MB in {len(written.layer_sizes)} layers, "
                f"{time.monotonic() - started:.0f} s)"
            )
    except (dockerfile.DockerfileError, debian.ResolveError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (build.BuildError, fetch.FetchError, deb.DebError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
