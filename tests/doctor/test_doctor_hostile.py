"""Every doctor command against hostile files and flags: exit 2 (bad input) or 1 (failure), one
line on stderr naming the file or flag, never a traceback, nothing written where not asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rdmaplane.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hostile")
    files = {
        "binary": bytes(range(256)) * 64,
        "not-utf8": b"host:1:2 [0] NCCL INFO \xff\xfe NET/IB : Using\n" * 10,
        "huge-line": b"x" * (8 << 20),
        "deep-json": b"[" * 100_000 + b"]" * 100_000,
        "deep-doctor-doc": b'{"schema": "rdmaplane.io/doctor/v1", "findings": '
        + b"[" * 5000
        + b"]" * 5000
        + b"}",
        "doc-with-junk-types": json.dumps(
            {"schema": "rdmaplane.io/doctor/v1", "status": ["x"], "findings": 7, "node": {}}
        ).encode(),
        "empty": b"",
        "escape-sequences": b"\x1b[2J\x1b]0;owned\x07 [red]markup[/red]\n",
    }
    paths = {}
    for name, data in files.items():
        paths[name] = d / name
        paths[name].write_bytes(data)
    paths["directory"] = d / "a-directory"
    paths["directory"].mkdir()
    paths["missing"] = d / "does-not-exist"
    return paths


def check(args: list[str], names: str, codes: tuple[int, ...] = (2,)) -> str:
    r = runner.invoke(app, args)
    err = r.stderr
    assert r.exit_code in codes, (args, r.exit_code, r.stdout, err)
    assert "Traceback" not in err + r.stdout
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    if r.exit_code == 2:
        assert len(err.strip().splitlines()) == 1, err
        assert names in err, (names, err)
        assert r.stdout == ""
    assert "\x1b" not in err
    return err


FILE_COMMANDS = [["doctor", "nccl-log"], ["doctor", "nccl-tests"], ["doctor", "report"]]


@pytest.mark.parametrize("command", FILE_COMMANDS, ids=lambda c: c[-1])
@pytest.mark.parametrize(
    "kind",
    [
        "binary",
        "not-utf8",
        "huge-line",
        "deep-json",
        "empty",
        "directory",
        "missing",
        "escape-sequences",
    ],
)
def test_hostile_files(command, kind, hostile):
    path = str(hostile[kind])
    if kind == "not-utf8" and command[-1] == "nccl-log":
        # NCCL lines with stray bytes are still a log: read, judged, never a traceback
        check([*command, path], path, codes=(0, 1))
        return
    err = check([*command, path], path)
    if kind == "directory":
        assert "is a directory" in err
    if kind == "missing":
        assert "cannot read" in err


def test_a_doctor_document_nested_too_deep(hostile):
    path = str(hostile["deep-doctor-doc"])
    assert "nested deeper than" in check(["doctor", "report", path], path)


def test_doctor_documents_with_junk_types_are_read_not_crashed_on(hostile):
    r = runner.invoke(app, ["doctor", "report", str(hostile["doc-with-junk-types"]), "-o", "json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["entries"][0]["status"] == "FAIL"


def test_escape_sequences_never_reach_the_terminal(hostile):
    err = check(["doctor", "nccl-log", str(hostile["escape-sequences"])], "could not parse")
    assert "\\x1b" in err and "[red]markup[/red]" in err


FLAGS = [
    (["doctor", "nccl-tests", "-", "--line-rate", "nan"], "--line-rate"),
    (["doctor", "nccl-tests", "-", "--line-rate", "-5"], "--line-rate"),
    (["doctor", "nccl-tests", "-", "--line-rate", "1e999"], "--line-rate"),
    (["doctor", "nccl-tests", "-", "--threshold", "0"], "--threshold"),
    (["doctor", "nccl-tests", "-", "--threshold", "7"], "--threshold"),
    (["doctor", "nccl-tests", "-", "-o", "xml"], "-o"),
    (["doctor", "nccl-log", "-", "-o", "yaml"], "-o"),
    (["doctor", "report", "-", "-o", "csv"], "-o"),
    (["doctor", "perf", "--client", "x", "--duration", "0"], "--duration"),
    (["doctor", "perf", "--client", "x", "--duration", "-3"], "--duration"),
    (["doctor", "perf", "--client", "x", "--port", "0"], "--port"),
    (["doctor", "perf", "--client", "x", "--port", "99999"], "--port"),
    (["doctor", "perf", "--client", "x", "--timeout", "nan"], "--timeout"),
    (["doctor", "perf", "--client", "x", "--timeout", "2", "--duration", "5"], "--timeout"),
    (["doctor", "perf", "--client", "x", "--threshold", "-1"], "--threshold"),
    (["doctor", "perf", "--client", "x", "--line-rate", "inf"], "--line-rate"),
    (["doctor", "perf", "--client", "x", "--gid-index", "-4"], "--gid-index"),
    (["doctor", "perf", "--client", "x", "--use-cuda", "-1"], "--use-cuda"),
    (["doctor", "perf", "--server", "--client", "x"], "--server"),
    (["doctor", "perf", "--client", ""], "--client"),
    (["doctor", "perf", "--client", "a b; reboot"], "--client"),
    (["doctor", "job", "a", "b", "--hcas", "0"], "--hcas"),
    (["doctor", "job", "a", "b", "--duration", "-1"], "--duration"),
    (["doctor", "job", "a", "b", "--namespace", "Bad_NS"], "--namespace"),
    (["doctor", "job", "a", "b", "--image", "two words"], "--image"),
    (["doctor", "job", "a", "../etc"], "node"),
    (["doctor", "job", "only-one"], "two distinct nodes"),
    (["doctor", "--root", "/nonexistent/root"], "--root"),
]


@pytest.mark.parametrize(
    ("args", "names"), FLAGS, ids=lambda a: " ".join(a) if isinstance(a, list) else a
)
def test_hostile_flags(args, names):
    r = runner.invoke(app, args, input="")
    assert r.exit_code == 2, (args, r.stdout, r.stderr)
    err = r.stderr
    assert len(err.strip().splitlines()) == 1 and names in err, err
    assert "Traceback" not in err and r.stdout == ""


def test_root_that_is_a_file(hostile):
    path = str(hostile["binary"])
    check(["doctor", "--root", path], "--root")
    check(["doctor", "perf", "--client", "x", "--root", path], "--root")
