"""Run by the image's own python inside the new root: every ELF file under the folders given
must find each library it needs, as the image's loader (`ld.so --list`) finds them. Exits 1
naming each file and library missing. Standard library only: nothing else is installed yet."""

from __future__ import annotations

import os
import subprocess
import sys

LOADER = "/lib64/ld-linux-x86-64.so.2"


def elf_files(top: str) -> list[str]:
    found = []
    for folder, _, names in os.walk(top):
        for name in names:
            path = os.path.join(folder, name)
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as f:
                    if f.read(4) == b"\x7fELF":
                        found.append(path)
    return found


def missing(path: str) -> list[str]:
    """What the loader cannot find for `path`: it lists each missing library as `not found`,
    or stops at the first one with an error."""
    listed = subprocess.run([LOADER, "--list", path], capture_output=True, text=True)
    if listed.returncode != 0:
        return [listed.stderr.strip().rsplit(": ", 3)[-3] if ": " in listed.stderr else "?"]
    return [line.split()[0] for line in listed.stdout.splitlines() if "not found" in line]


def main(tops: list[str]) -> int:
    gaps = [f"{path}: {lib}" for top in tops for path in elf_files(top) for lib in missing(path)]
    if gaps:
        print("libraries missing in the image:\n" + "\n".join(sorted(gaps)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
