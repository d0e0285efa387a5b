"""What an `rdmaplane` command costs before and while it answers: CPU seconds (user + system,
of the process and what it starts) of each command, beside a bare interpreter, in one run.

Usage: python bench/cli.py [--runs N]   (PYTHONPATH=src to measure a checkout's code)

It ends with the table docs/discovery.md quotes ("Command start-up"): the one set of start-up
figures in the docs, and `inject -o yaml` beside `-o json` on a 1.5 MB manifest and a 50 MB
annotation (issue 40: YAML is written by libyaml's emitter, linear in its input).

Each round runs every command once, in the same order, so the machine's load falls on all of
them alike; the figure is the median over the rounds. Goals (issue 24): `--version` and
`--help` at most 0.10 s; any command on a sample at most 0.25 s; a snapshot read from its
archive in memory at most twice the `tar xzf` of the same archive (the floor: what any reader
must at least do, decompress and unpack it).
"""

from __future__ import annotations

import argparse
import os
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
    manifest, annotation = work / "manifest-1.5MB.yaml", work / "annotation-50MB.yaml"
    big_manifests(manifest, annotation)
    return {"snapshot": snapshot, "nrt": nrt, "manifest": manifest, "annotation": annotation}


def big_manifests(manifest: Path, annotation: Path) -> None:
    """A 1.5 MB manifest (380 GPU pods of two namespaces as `kubectl get -o yaml` exports them:
    a long `last-applied-configuration`, signed URLs in env) and one pod with a 50 MB
    annotation: what `inject -o yaml` and `-o json` are measured on (issue 40)."""
    import json

    import yaml

    def pod(i: int) -> dict[str, object]:
        applied = json.dumps({"spec": {"containers": [{"args": ["--x=" + "y" * 1500]}]}})
        url = "https://storage.example.com/b/o?X-Amz-Signature=" + "a" * 400
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"trainer-{i // 2}",
                "namespace": ("team-a", "team-b")[i % 2],
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": applied},
            },
            "spec": {
                "containers": [
                    {
                        "name": "train",
                        "image": "ghcr.io/example/train:1",
                        "env": [{"name": f"URL{j}", "value": url} for j in range(5)],
                        "resources": {"limits": {"nvidia.com/gpu": "8"}},
                    }
                ]
            },
        }

    manifest.write_text(yaml.safe_dump_all([pod(i) for i in range(380)], width=2**30))
    one = pod(0)
    one["metadata"]["annotations"] = {"example.com/blob": "A" * (50 << 20)}  # type: ignore[index]
    annotation.write_text(yaml.safe_dump(one, width=2**30))


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
                "import sys; from rdmaplane.adapters import discovery; "
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
        *(
            (f"inject {name} -o {o}", [r, "inject", str(files[key]), "-o", o], None)
            for key, name in (("manifest", "1.5 MB manifest"), ("annotation", "50 MB annotation"))
            for o in ("json", "yaml")
        ),
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
    print()
    print(f"As docs/discovery.md quotes it (load average {os.getloadavg()[0]:.1f} at the end):")
    print()
    print(f"| command | CPU s | × bare ({bare:.3f} s) | goal |")
    print("|---|---|---|---|")
    for what, _, goal in measured[1:]:
        shown = "" if goal is None else f"≤ {goal:.2f}"
        print(f"| `{what}` | {median[what]:.3f} | {median[what] / bare:.1f} | {shown} |")
    print()
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
