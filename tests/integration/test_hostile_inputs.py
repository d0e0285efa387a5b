"""One corpus of hostile and careless inputs, fed to every command that reads a file or a flag.

Every case must end the same way: exit 2 (bad input) or 1 (failure), stderr exactly one line
`error: ...` that names the input (the path, the flag or the value), no traceback, nothing
written anywhere (not in the working directory, not beside the input, not in the temporary
folder), and no service started. Commands run in-process through typer's CliRunner, from an
empty working directory.

To cover a new command, add its `Slot`s to `SLOTS` (one per flag or argument that takes input,
the rest of the command line valid); `test_every_command_has_a_slot` fails until you do. To
cover a new kind of hostile input, add a `Hostile` to the corpus it belongs to. A case that
fails on this branch because another branch owns the fix is marked in `OWNED` (strict xfail:
it fails the run as soon as it passes, so the mark is removed when the fix lands).
"""

from __future__ import annotations

import gzip
import io
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from rdmaplane.adapters.discovery import samples
from rdmaplane.cli import COMMANDS, app, load_command
from rdmaplane.core import nrt
from rdmaplane.core.untrusted import printable
from tests.fabrics import leaf_spine
from tests.layouts import layout
from tests.scheduler_helpers import node, pod

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Hostile:
    """One hostile input: `make(folder)` writes what it needs below `folder` and returns the
    command-line argument; the error line must contain `named(argument)`. With `warns`, what
    the reader tolerated may come first as `warning:` lines (a broken sidecar in a snapshot
    is a warning naming its key: the tree beside it may still be good)."""

    name: str
    make: Callable[[Path], str]
    named: Callable[[str], str] = printable
    warns: bool = False


def _file(name: str, content: bytes) -> Callable[[Path], str]:
    def make(folder: Path) -> str:
        (folder / name).write_bytes(content)
        return str(folder / name)

    return make


def _dir(folder: Path) -> str:
    (folder / "a-directory").mkdir()
    return str(folder / "a-directory")


def _missing(folder: Path) -> str:
    return str(folder / "missing" / "file.yaml")


def _value(value: str) -> Callable[[Path], str]:
    return lambda _folder: value


def _tar(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


# ---------------------------------------------------------------- the corpus


JUNK = b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01"
DEEP_JSON = b"[" * 5000 + b"]" * 5000
DEEP_YAML = b"a:\n" + b"".join(b"  " * i + b"b:\n" for i in range(1, 3000))

PATHS = (
    Hostile("missing", _missing),
    Hostile("a-directory", _dir),
    Hostile("markup-in-the-name", _file("[bold]x[red].yaml", b"\xff\xfe")),
    Hostile("escape-in-the-name", _file("x\x1b[2J.yaml", b"\xff\xfe")),
)
UNREADABLE = (
    *PATHS,
    Hostile("binary-junk", _file("junk", JUNK)),
    Hostile("deep-json", _file("deep.json", DEEP_JSON)),
)
# YAML/JSON documents: configs, pods, NRTs, node documents, kubeconfigs
DOCUMENTS = (
    *UNREADABLE,
    Hostile("nul-bytes", _file("nul.yaml", b"a: 1\x00\n")),
    Hostile("deep-yaml", _file("deep.yaml", DEEP_YAML)),
    Hostile("syntax-error", _file("syntax.yaml", b"a: [1, 2\nb: }\n")),
    Hostile("a-list", _file("list.yaml", b"[1, 2, 3]\n")),
    Hostile("a-string", _file("string.yaml", b"just some words\n")),
    Hostile("metadata-a-string", _file("meta.yaml", b'kind: Pod\nmetadata: "x"\nspec: 7\n')),
)
# text a command parses itself (logs, command outputs)
TEXTS = (*UNREADABLE, Hostile("empty", _file("empty.txt", b"")))
ARCHIVES = (
    *PATHS,
    Hostile("binary-junk", _file("junk.tar.gz", JUNK)),
    Hostile("empty-file", _file("empty.tar.gz", b"")),
    Hostile("gzip-of-junk", _file("junk2.tar.gz", gzip.compress(b"not a tar" * 100))),
    Hostile("absolute-member", _file("abs.tar.gz", _tar([(_member("/etc/evil"), b"x")]))),
    Hostile("member-leaves", _file("up.tar.gz", _tar([(_member("../../evil"), b"x")]))),
    Hostile(
        "link-leaves",
        _file("link.tar.gz", _tar([(_member("class", tarfile.SYMTYPE, "/etc"), b"")])),
    ),
    Hostile(
        "device-file",
        _file("dev.tar.gz", _tar([(_member("class/null", tarfile.CHRTYPE), b"")])),
    ),
    Hostile("empty-archive", _file("nothing.tar.gz", _tar([]))),
    Hostile(
        "deep-sidecar",
        _file("side.tar.gz", _tar([(_member(".rdmaplane/node.json"), DEEP_JSON)])),
        warns=True,
    ),
)
SAMPLE_NAMES = (
    Hostile("empty", _value(""), lambda _: "--sample"),
    Hostile("climbs-out", _value("../../etc")),
    Hostile("absolute", _value("/etc/passwd")),
    Hostile("unknown", _value("nope")),
    Hostile("escape", _value("x\x1b[2J")),
)
DIRS = (
    Hostile("missing", lambda folder: str(folder / "missing")),
    Hostile("a-file", _file("a-file", b"x")),
    Hostile("empty-string", _value(""), lambda _: "--"),
)
# where a command is asked to write
TARGETS = (
    Hostile("a-directory", _dir),
    Hostile("parent-missing", _missing),
    Hostile("empty-string", _value(""), lambda _: "-o"),
)


def _full_dir(folder: Path) -> str:
    (Path(_dir(folder)) / "keep").write_text("x")
    return str(folder / "a-directory")


MATERIALIZE_TARGETS = (
    Hostile("a-file", _file("a-file", b"x")),
    Hostile("parent-missing", _missing),
    Hostile("not-empty", _full_dir),
)


def values(*given: tuple[str, str]) -> tuple[Hostile, ...]:
    """Flag values, each with what its error line must contain."""
    return tuple(Hostile(f"value-{v or 'empty'}", _value(v), lambda _, n=n: n) for v, n in given)


# ---------------------------------------------------------------- where each command takes input


@dataclass(frozen=True)
class Slot:
    """One place a command takes input: the command, then its arguments with `{}` for the
    hostile one and `{pod}`, `{nrt}`, `{tree}`, `{root}`, `{plugin}`, `{nccl-tests}`,
    `{fabric}`, `{nodes}` for known-good inputs (see `good`)."""

    command: str
    args: tuple[str, ...]
    corpus: tuple[Hostile, ...]

    @property
    def argv(self) -> list[str]:
        return [*self.command.split(), *self.args]

    @property
    def id(self) -> str:
        return " ".join(self.argv)


NODE_SOURCES = ("inspect", "env", "gid explain", "nrt")
WS = ("--sample", "workstation")
AGENT = ("--node-name", "n", "--no-publish")
SLOTS: list[Slot] = [
    *(Slot(c, ("--snapshot", "{}"), ARCHIVES) for c in NODE_SOURCES),
    *(Slot(c, ("--sample", "{}"), SAMPLE_NAMES) for c in NODE_SOURCES),
    *(Slot(c, ("--sysfs-root", "{}"), DIRS) for c in NODE_SOURCES),
    Slot("inspect", (*WS, "-o", "{}"), values(("xml", "'xml'"), ("", "''"))),
    Slot("env", (*WS, "--hca", "{}"), values(("nope", "--hca nope"))),
    Slot("env", (*WS, "--family", "{}"), values(("5", "5"), ("x", "'x'"))),
    Slot(
        "env",
        ("--sample", "workstation", "--addr-range", "{}"),
        values(("10.0.0.0/99", "10.0.0.0/99")),
    ),
    Slot("env", (*WS, "--nccl-version", "{}"), values(("two", "two"))),
    Slot("env", (*WS, "-o", "{}"), values(("xml", "'xml'"))),
    Slot("gid explain", (*WS, "--roce-version", "{}"), values(("7", "7"))),
    Slot("gid audit", ("{}",), DOCUMENTS),
    Slot("gid audit", ("--snapshot", "{}"), ARCHIVES),
    Slot("gid audit", ("--sample", "{}"), SAMPLE_NAMES),
    Slot("audit", ("{}",), DOCUMENTS),
    Slot("audit", ("--snapshot", "{}"), ARCHIVES),
    Slot("audit", ("--sample", "{}"), SAMPLE_NAMES),
    Slot("audit", ("--nrt", "{}"), DOCUMENTS),
    Slot("audit", ("--kubeconfig", "{}"), DOCUMENTS),
    Slot("audit", (*WS, "-o", "{}"), values(("xml", "'xml'"))),
    Slot("nrt", (*WS, "--device-plugin-config", "{}"), DOCUMENTS),
    Slot("nrt", (*WS, "--dev-root", "{}"), DIRS),
    Slot(
        "nrt",
        ("--sample", "workstation", "--topology-manager-policy", "{}"),
        values(("best", "best")),
    ),
    Slot("samples", ("-o", "{}"), values(("xml", "'xml'"))),
    Slot("samples materialize", ("{}", "new"), SAMPLE_NAMES[1:]),
    Slot("samples materialize", ("workstation", "{}"), MATERIALIZE_TARGETS),
    Slot("snapshot create", ("--sysfs-root", "{tree}", "-o", "{}"), TARGETS),
    Slot("snapshot create", ("-o", "out.tar.gz", "--sysfs-root", "{}"), DIRS),
    Slot("device-plugin", ("--config", "{}"), DOCUMENTS),
    Slot("device-plugin", ("--config", "{plugin}", "--sysfs-root", "{}"), DIRS),
    Slot("device-plugin", ("--config", "{plugin}", "--kubelet-dir", "{}"), DIRS),
    Slot("agent", (*AGENT, "--config", "{}"), DOCUMENTS),
    Slot("agent", (*AGENT, "--device-plugin-config", "{}"), DOCUMENTS),
    Slot(
        "agent",
        ("--node-name", "n", "--no-device-plugin", "--sysfs-root", "{tree}", "--kubeconfig", "{}"),
        DOCUMENTS,
    ),
    Slot("agent", (*AGENT, "--sysfs-root", "{}"), DIRS),
    Slot("agent", (*AGENT, "--sysfs-root", "{tree}", "--kubelet-dir", "{}"), DIRS),
    Slot(
        "agent",
        ("--node-name", "n", "--no-publish", "--metrics-port", "{}"),
        values(("99999", "99999")),
    ),
    Slot(
        "agent", ("--node-name", "n", "--no-publish", "--log-format", "{}"), values(("xml", "xml"))
    ),
    Slot("dra-driver", ("--node-name", "n", "--config", "{}"), DOCUMENTS),
    Slot("dra-driver", ("--node-name", "n", "--device-plugin-config", "{}"), DOCUMENTS),
    Slot("dra-driver", ("--node-name", "n", "--sysfs-root", "{}"), DIRS),
    Slot("dra-driver", ("--node-name", "n", "--sysfs-root", "{tree}", "--kubelet-dir", "{}"), DIRS),
    Slot(
        "dra-driver",
        (
            "--node-name",
            "n",
            "--sysfs-root",
            "{tree}",
            "--kubelet-dir",
            "{tree}",
            "--kubeconfig",
            "{}",
        ),
        DOCUMENTS,
    ),
    Slot("dra-driver", ("--node-name", "n", "--metrics-port", "{}"), values(("99999", "99999"))),
    Slot("dra-driver", ("--node-name", "n", "--log-format", "{}"), values(("xml", "xml"))),
    Slot("doctor", ("--root", "{}"), DIRS),
    Slot("doctor", ("-o", "{}"), values(("xml", "xml"))),
    Slot("doctor nccl-tests", ("{}",), TEXTS),
    Slot("doctor nccl-tests", ("{nccl-tests}", "--line-rate", "{}"), values(("-5", "-5"))),
    Slot("doctor nccl-log", ("{}",), TEXTS),
    Slot("doctor report", ("{}",), TEXTS),
    Slot("doctor perf", ("--server", "--root", "{}"), DIRS),
    Slot(
        "doctor perf",
        ("--client", "peer", "--root", "{root}", "--timeout", "{}"),
        values(("-1", "-1")),
    ),
    Slot("doctor job", ("{}",), values(("only-one", "two"))),
    Slot("scheduler-extender", ("--config", "{}"), DOCUMENTS),
    Slot("scheduler-extender", ("--log-format", "{}"), values(("xml", "'xml'"))),
    Slot("scheduler-extender", ("--port", "{}"), values(("99999", "99999"), ("http", "'http'"))),
    Slot("scheduler-extender", ("--kubeconfig", "{}"), DOCUMENTS),
    Slot("scheduler-extender", ("--tls-cert-file", "{}", "--tls-key-file", "{}"), UNREADABLE),
    Slot("explain-placement", ("{}", "--nrt", "{nrt}"), DOCUMENTS),
    Slot("explain-placement", ("{pod}", "--nrt", "{}"), DOCUMENTS),
    Slot("explain-placement", ("{pod}", "--nrt", "{nrt}", "--nodes", "{}"), DOCUMENTS),
    Slot("explain-placement", ("{pod}", "--nrt", "{nrt}", "--pods", "{}"), DOCUMENTS),
    Slot("explain-placement", ("{pod}", "--kubeconfig", "{}"), DOCUMENTS),
    Slot("explain-placement", ("{pod}", "--nrt", "{nrt}", "--config", "{}"), DOCUMENTS),
    Slot("explain-placement", ("{pod}", "--nrt", "{nrt}", "-o", "{}"), values(("xml", "xml"))),
    Slot("config validate", ("{}",), DOCUMENTS),
    Slot("config defaults", ("{}",), values(("Nope", "'Nope'"), ("", "''"))),
    Slot("fabric show", ("--fabric-file", "{}"), DOCUMENTS),
    Slot("fabric show", ("--nodes", "{}"), DOCUMENTS),
    Slot("fabric show", ("--nodes", "{nodes}", "--nrt", "{}"), DOCUMENTS),
    Slot("fabric show", ("--fabric-file", "{fabric}", "--pods", "{}"), DOCUMENTS),
    Slot("fabric show", ("--kubeconfig", "{}"), DOCUMENTS),
    Slot("fabric show", ("--fabric-file", "{fabric}", "-o", "{}"), values(("xml", "'xml'"))),
    Slot("fabric export", ("--volcano", "--fabric-file", "{}"), DOCUMENTS),
    Slot("fabric export", ("--kueue", "--nodes", "{}"), DOCUMENTS),
    Slot(
        "fabric export",
        ("--kueue", "--fabric-file", "{fabric}", "--name", "{}"),
        values(("", "name")),
    ),
    Slot("webhook", ("--config", "{}"), DOCUMENTS),
    Slot("webhook", ("--kubeconfig", "{}"), DOCUMENTS),
    Slot("webhook", ("--port", "{}"), values(("99999", "99999"), ("https", "'https'"))),
    Slot("webhook", ("--log-format", "{}"), values(("xml", "'xml'"))),
    Slot("inject", ("{}",), DOCUMENTS),
    Slot("inject", ("{pod}", "--config", "{}"), DOCUMENTS),
    Slot("inject", ("{pod}", "-o", "{}"), values(("xml", "'xml'"))),
]

# (slot id, hostile name) → the branch that owns the fix, and what is wrong on this one; empty
# on main (a case may be marked here only while a branch that fixes it is in flight)
OWNED: dict[tuple[str, str], str] = {}


def cases() -> Iterator[object]:
    for slot in SLOTS:
        for hostile in slot.corpus:
            owner = OWNED.get((slot.id, hostile.name))
            marks = [pytest.mark.xfail(strict=True, reason=owner)] if owner else []
            yield pytest.param(slot, hostile, id=f"{slot.id} <- {hostile.name}", marks=marks)


# ---------------------------------------------------------------- running them


class Served(Exception):
    """The command accepted the input and went on to serve: the case has failed."""


# what each long-running command calls once its input was accepted
SERVING = [
    ("uvicorn", "run"),
    ("rdmaplane.cli.agent", "_serve"),
    ("rdmaplane.services.deviceplugin.root", "exec_standalone"),
    ("rdmaplane.services.doctor.perf", "serve"),
    ("rdmaplane.services.doctor.perf", "run_client"),
    ("rdmaplane.services.webhook.root", "serve"),
]


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Known-good inputs for the rest of each command line."""
    base = tmp_path_factory.mktemp("good")
    (base / "pod.yaml").write_text(yaml.safe_dump(pod("job", 1, 1)))
    topology = layout("hgx-h100-roce", "hgx", policy="none")
    (base / "nrt.yaml").write_text(yaml.safe_dump(nrt.to_object(topology)))
    samples.build(samples.load("workstation").spec, base / "tree")
    samples.build(samples.load("hgx-h100-roce").spec, base / "root" / "sys")  # `doctor --root`
    (base / "fabric.yaml").write_text(yaml.safe_dump(leaf_spine(2, 4)))
    (base / "nodes.yaml").write_text(yaml.safe_dump({"kind": "List", "items": [node("gpu-000")]}))
    return {
        "{pod}": str(base / "pod.yaml"),
        "{nrt}": str(base / "nrt.yaml"),
        "{tree}": str(base / "tree"),
        "{root}": str(base / "root"),
        "{plugin}": str(REPO / "deploy/device-plugin/config-exclusive.yaml"),
        "{nccl-tests}": str(
            REPO / "tests/doctor/fixtures/nccl_tests/v2.17.1_all_reduce_2node_mpirun.txt"
        ),
        "{fabric}": str(base / "fabric.yaml"),
        "{nodes}": str(base / "nodes.yaml"),
    }


def tree_of(*folders: Path) -> set[tuple[str, int]]:
    """Every entry below `folders`, with the modification time of files and folders (a new
    entry changes its folder's)."""
    return {
        (str(p), 0 if p.is_symlink() else p.stat().st_mtime_ns)
        for folder in folders
        for p in [folder, *folder.rglob("*")]
    }


@pytest.mark.parametrize(("slot", "hostile"), list(cases()))
def test_hostile_input_gets_one_line_and_nothing_else(
    slot: Slot,
    hostile: Hostile,
    good: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inputs, cwd, scratch = tmp_path / "inputs", tmp_path / "cwd", tmp_path / "tmp"
    for folder in (inputs, cwd, scratch):
        folder.mkdir()
    argument = hostile.make(inputs)
    argv = [argument if a == "{}" else good.get(a, a) for a in slot.argv]
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    for module, name in SERVING:
        monkeypatch.setattr(f"{module}.{name}", _served, raising=True)
    used = [Path(good[a]) for a in slot.args if a in good and Path(good[a]).is_dir()]
    before = tree_of(inputs, *used)
    result = CliRunner().invoke(app, argv, input="")
    assert not isinstance(result.exception, Served), f"accepted {argument!r} and started serving"
    assert result.exception is None or isinstance(result.exception, SystemExit), _traceback(result)
    assert result.exit_code in (1, 2), (result.exit_code, result.output)
    *warnings, last = result.stderr.splitlines() or [""]
    assert last.startswith("error: ") and hostile.named(argument) in last, result.stderr
    assert all(w.startswith("warning: ") for w in warnings) if hostile.warns else not warnings
    assert "Traceback" not in result.output
    assert tree_of(inputs, *used) == before, "wrote beside its input"
    assert not any(cwd.iterdir()), f"wrote into the working directory: {list(cwd.iterdir())}"
    assert not any(scratch.iterdir()), f"left temporary files: {list(scratch.iterdir())}"


def _served(*args: object, **kwargs: object) -> None:
    raise Served


def _traceback(result: object) -> str:
    import traceback

    exc = getattr(result, "exc_info", None)
    return "".join(traceback.format_exception(*exc)) if exc else repr(result)


def _commands(command: object, path: tuple[str, ...] = ()) -> Iterator[str]:
    subs = getattr(command, "commands", None)
    if not path:  # the root loads its commands on use: all of them here
        subs = {name: load_command(name) for name in COMMANDS}
    if not subs or (path and getattr(command, "invoke_without_command", False)):
        yield " ".join(path)
    for name, sub in (subs or {}).items():
        yield from _commands(sub, (*path, name))


def test_every_command_has_a_slot() -> None:
    """A new command (or subcommand) must say where it takes input, so the corpus reaches it."""
    commands = set(_commands(typer.main.get_command(app)))
    assert {"inspect", "gid audit", "doctor nccl-log", "samples materialize"} <= commands
    missing = sorted(commands - {s.command for s in SLOTS})
    assert not missing, f"add Slots for {missing} to SLOTS"
    unknown = sorted({s.command for s in SLOTS} - commands)
    assert not unknown, f"SLOTS name commands that do not exist: {unknown}"


def test_every_owned_case_exists() -> None:
    """An `OWNED` mark whose case was renamed away would hide nothing and mean nothing."""
    known = {(slot.id, hostile.name) for slot in SLOTS for hostile in slot.corpus}
    assert not set(OWNED) - known, sorted(set(OWNED) - known)
    assert len(known) == len(list(cases())) > 300
