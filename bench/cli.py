"""What an `rdmaplane` command costs before and while it answers: CPU seconds (user + system,
of the process and what it starts) of each command, beside a bare interpreter, in one run.

Usage: python bench/cli.py [--runs N]

Each round runs every command once, in the same order, so the machine's load falls on all of
them alike; the figure is the median over the rounds. Goals (issue 24): `--version` and
`--help` at most 0.10 s; any command on a sample at most 0.25 s; a snapshot read from its
archive in memory at most twice the `tar xzf` of the same archive (the floor: what any reader
must at least do, decompress and unpack it).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RDMAPLANE = str(BIN / "rdmaplane")


FRESH = "{fresh}"  # in an argv: a new empty folder for each run (tar's target)


def cpu_of(argv: list[str], cwd: Path) -> float:
    """CPU seconds of one run of `argv` and its children."""
    argv = [tempfile.mkdtemp(dir=cwd) if a == FRESH else a for a in argv]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def prepare(work: Path) -> dict[str, Path]:
    """Inputs the commands read: a snapshot, an NRT, a pod; made once, outside the figures."""
    tree = work / "sys"
    subprocess.run(
        [RDMAPLANE, "samples", "materialize", "hgx-h100-roce", str(tree)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    snapshot = work / "node.tar.gz"
    subprocess.run(
        [RDMAPLANE, "snapshot", "create", "-o", str(snapshot), "--sysfs-root", str(tree)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    nrt = work / "nrt.yaml"
    nrt.write_text(
        subprocess.run(
            [RDMAPLANE, "nrt", "--sample", "hgx-h100-roce"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    return {"snapshot": snapshot, "nrt": nrt}


def commands(files: dict[str, Path]) -> list[tuple[str, list[str], float | None]]:
    """(what, argv, goal in CPU seconds or None) for each measured command."""
    sample = ["--sample", "hgx-h100-roce"]
    job = str(REPO / "examples" / "indexed-job.yaml")
    r = RDMAPLANE
    return [
        ("python -c pass (bare interpreter)", [sys.executable, "-c", "pass"], None),
        ("rdmaplane --version", [r, "--version"], 0.10),
        ("rdmaplane --help", [r, "--help"], 0.10),
        ("rdmaplane inspect --help", [r, "inspect", "--help"], 0.10),
        ("inspect --sample ... -o json", [r, "inspect", *sample, "-o", "json"], 0.25),
        ("inspect --sample ... (table)", [r, "inspect", *sample], 0.25),
        ("inspect --sample ... -o matrix", [r, "inspect", *sample, "-o", "matrix"], 0.25),
        ("env --sample ...", [r, "env", *sample], 0.25),
        ("gid explain --sample ...", [r, "gid", "explain", *sample], 0.25),
        (
            "gid audit --sample ... --sample ...",
            [r, "gid", "audit", *sample, "--sample", "dgx-a100"],
            0.25,
        ),
        ("nrt --sample ...", [r, "nrt", *sample], 0.25),
        ("samples", [r, "samples"], 0.25),
        (
            "inspect --snapshot (hgx-h100-roce) -o json",
            [r, "inspect", "--snapshot", str(files["snapshot"]), "-o", "json"],
            None,
        ),
        (
            "tar xzf of that snapshot (the floor)",
            [
                "tar",
                "xzf",
                str(files["snapshot"]),
                "-C",
                FRESH,
            ],
            None,
        ),
        (
            "python: read the snapshot (imports included)",
            [
                sys.executable,
                "-c",
                "import sys; from rdmaplane import discovery; "
                "discovery.load_node(snapshot_file=sys.argv[1])",
                str(files["snapshot"]),
            ],
            None,
        ),
        (
            "python: the imports alone",
            [sys.executable, "-c", "import rdmaplane.adapters.discovery"],
            None,
        ),
        (
            "explain-placement JOB --nrt FILE",
            [r, "explain-placement", job, "--nrt", str(files["nrt"])],
            None,
        ),
        ("inject examples/indexed-job.yaml", [r, "inject", job], None),
        (
            "config validate deploy/agent/daemonset.yaml",
            [r, "config", "validate", str(REPO / "deploy" / "agent" / "daemonset.yaml")],
            None,
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rdmaplane-bench-cli-") as tmp:
        work = Path(tmp)
        measured = commands(prepare(work))
        times: dict[str, list[float]] = {what: [] for what, _, _ in measured}
        for _ in range(args.runs):
            for what, argv, _ in measured:
                times[what].append(cpu_of(argv, work))
    median = {what: statistics.median(t) for what, t in times.items()}
    bare = median[measured[0][0]]
    print(f"CPU seconds per command, median of {args.runs} interleaved rounds")
    print(f"{'command':<48} {'CPU s':>7} {'x bare':>7}  goal")
    for what, _, goal in measured:
        verdict = (
            "" if goal is None else f"<= {goal:.2f}: {'met' if median[what] <= goal else 'MISSED'}"
        )
        print(f"{what:<48} {median[what]:7.3f} {median[what] / bare:7.1f}  {verdict}")
    floor = median["tar xzf of that snapshot (the floor)"]
    read = (
        median["python: read the snapshot (imports included)"] - median["python: the imports alone"]
    )
    verdict = "met" if read <= 2 * floor else "MISSED"
    print(
        f"snapshot read in memory: {read:.3f} s = {read / floor:.2f}x the tar floor "
        f"({floor:.3f} s); goal <= 2x: {verdict}"
    )


if __name__ == "__main__":
    main()
