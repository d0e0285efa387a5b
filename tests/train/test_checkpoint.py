"""Atomic checkpoints: round trip, keep-K, torn and corrupt files skipped, and the bad cases —
an unwritable folder, a read-only file system and a full disk (small tmpfs mounts in a private
mount namespace, so the kernel itself answers EROFS and ENOSPC)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rdmaplane import train
from rdmaplane.train import checkpoint


def test_round_trip_keeps_the_newest_k(tmp_path: Path):
    for step in range(1, 6):
        train.save(tmp_path, step, f"state {step}".encode(), keep=3, meta={"epoch": step // 2})
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"ckpt-{s:012d}.rdmaplane" for s in (3, 4, 5)]
    found = train.latest(tmp_path)
    assert (found.step, found.payload, found.meta) == (5, b"state 5", {"epoch": 2})


def test_fresh_start_when_nothing_is_there(tmp_path: Path):
    assert train.latest(tmp_path / "absent") is None
    assert train.load_object(tmp_path) is None


def test_objects_round_trip(tmp_path: Path):
    train.save_object(tmp_path, 7, {"weights": [1.5, 2.5], "step": 7})
    assert train.load_object(tmp_path) == (7, {"weights": [1.5, 2.5], "step": 7})


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) - 3])
    elif how == "flip":
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    elif how == "header":
        path.write_bytes(checkpoint.MAGIC + b"{not json\n" + data[-4:])
    elif how == "magic":
        path.write_bytes(b"PK\x03\x04" + data)
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "torn-header":
        path.write_bytes(data[: len(checkpoint.MAGIC) + 5])


@pytest.mark.parametrize(
    ("how", "why"),
    [
        ("truncate", "truncated: "),
        ("flip", "checksum mismatch"),
        ("header", "unreadable header"),
        ("magic", "not an rdmaplane checkpoint (bad magic)"),
        ("empty", "not an rdmaplane checkpoint (bad magic)"),
        ("torn-header", "torn header"),
    ],
)
def test_damaged_newest_falls_back_to_the_previous_with_a_warning(tmp_path: Path, how, why):
    train.save(tmp_path, 10, b"ten" * 100)
    newest = train.save(tmp_path, 20, b"twenty" * 100)
    _damage(newest, how)
    with pytest.warns(
        train.CheckpointWarning, match=re.escape(f"skipping checkpoint {newest}: {why}")
    ):
        found = train.latest(tmp_path)
    assert (found.step, found.payload) == (10, b"ten" * 100)


def test_a_crashed_writers_temp_file_is_never_resumed_from(tmp_path: Path):
    train.save(tmp_path, 1, b"one")
    (tmp_path / ".ckpt-000000000002.rdmaplane.999.tmp").write_bytes(b"half of two")
    assert train.latest(tmp_path).step == 1


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=40)
@given(
    st.lists(
        st.tuples(
            st.binary(max_size=300),
            st.sampled_from(["ok", "truncate", "flip", "header", "magic", "empty"]),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_latest_is_the_newest_intact_checkpoint(tmp_path_factory, history):
    """Whatever mix of intact and damaged files: `latest` returns exactly the newest intact
    payload, never bytes of a damaged one."""
    folder = tmp_path_factory.mktemp("ckpt")
    intact = None
    for step, (payload, how) in enumerate(history):
        path = train.save(folder, step, payload, keep=len(history))
        if how == "ok":
            intact = (step, payload)
        else:
            _damage(path, how)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", train.CheckpointWarning)
        found = train.latest(folder)
    assert (None if found is None else (found.step, found.payload)) == intact
    shutil.rmtree(folder)


def test_a_streamed_payload_round_trips_and_reads_back_as_a_stream(tmp_path: Path):
    chunks = [bytes([i]) * 100_000 for i in range(30)]
    train.save_with(tmp_path, 4, lambda out: [out.write(c) for c in chunks], meta={"k": "v"})
    found = train.latest(tmp_path)
    assert (found.step, found.size, found.meta) == (4, 3_000_000, {"k": "v"})
    with found.open() as f:
        assert f.read(5) == b"\0" * 5
        f.seek(-3, os.SEEK_END)
        assert f.read() == b"\x1d" * 3
        f.seek(0)
        assert f.read() == b"".join(chunks) == found.payload


def test_a_writer_that_fails_leaves_nothing_and_its_error_propagates(tmp_path: Path):
    train.save(tmp_path, 1, b"one")

    def broken(out) -> None:
        out.write(b"x" * 1000)
        raise RuntimeError("serializer failed")

    with pytest.raises(RuntimeError, match="serializer failed"):
        train.save_with(tmp_path, 2, broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000000001.rdmaplane"]


def test_a_killed_writers_leftovers_go_with_the_next_save_of_a_later_step(tmp_path: Path):
    older = tmp_path / ".ckpt-000000000002.rdmaplane.77.0badc0de.tmp"
    newer = tmp_path / ".ckpt-000000000009.rdmaplane.77.0badc0de.tmp"
    for leftover in (older, newer):
        leftover.write_bytes(b"half")
    train.save(tmp_path, 3, b"three")
    assert not older.exists() and newer.exists()  # 9 may still be being written


def test_too_much_meta_is_refused_before_anything_is_written(tmp_path: Path):
    with pytest.raises(ValueError, match="checkpoint meta too large"):
        train.save(tmp_path, 1, b"x", meta={"blob": "x" * checkpoint.MAX_HEADER})
    assert list(tmp_path.iterdir()) == []


def test_folder_that_is_a_file_is_a_one_line_error(tmp_path: Path):
    blocker = tmp_path / "ckpt"
    blocker.write_text("not a folder")
    with pytest.raises(train.CheckpointError) as err:
        train.save(blocker / "run1", 3, b"x")
    assert str(err.value).endswith(
        f"{blocker / 'run1'}: cannot write the checkpoint of step 3: Not a directory"
    )
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------- real file systems

SCENARIO = textwrap.dedent(
    """
    import json, os, subprocess, sys, warnings
    from rdmaplane import train

    mount, kind = sys.argv[1], sys.argv[2]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "rdmaplane-test", mount], check=True)
    folder = os.path.join(mount, "ckpt")
    out = {}
    train.save(folder, 1, b"a" * 10_000)          # fits
    if kind == "readonly":
        subprocess.run(["mount", "-o", "remount,ro", mount], check=True)
        payload = b"b" * 10
    else:
        payload = b"b" * 100_000                    # does not fit in what is left
    try:
        train.save(folder, 2, payload)
    except train.CheckpointError as e:
        out["error"] = str(e)
    out["files"] = sorted(os.listdir(folder))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = train.latest(folder)
    out["latest"] = [found.step, len(found.payload)] if found else None
    out["warnings"] = [str(w.message) for w in caught]
    print(json.dumps(out))
    """
)


def _in_private_mount_namespace(tmp_path: Path, kind: str) -> dict:
    """Run the scenario under `unshare -m` (root in this sandbox and in CI): the tmpfs exists
    only there and disappears with the process."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    result = subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            sys.executable,
            "-c",
            SCENARIO,
            str(mount),
            kind,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_full_disk_during_save_leaves_the_previous_checkpoint(tmp_path: Path):
    out = _in_private_mount_namespace(tmp_path, "full")
    assert "cannot write the checkpoint of step 2: No space left on device" in out["error"]
    assert out["files"] == ["ckpt-000000000001.rdmaplane"]  # no partial file left behind
    assert out["latest"] == [1, 10_000]
    assert out["warnings"] == []


def test_read_only_file_system(tmp_path: Path):
    out = _in_private_mount_namespace(tmp_path, "readonly")
    assert "cannot write the checkpoint of step 2: Read-only file system" in out["error"]
    assert out["latest"] == [1, 10_000]
