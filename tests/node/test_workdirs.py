"""A run removes the node folders of killed runs, never a live node's (`realnode.node_workdir`)."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from tests.node.realnode import IN_USE, UNLOCKED_GRACE_S, WORKDIR_PREFIX, remove_stale_workdirs


def _folder(parent: Path, name: str, *, lock_file: bool, age_s: float = 0.0) -> Path:
    folder = parent / (WORKDIR_PREFIX + name)
    (folder / "containerd").mkdir(parents=True)
    (folder / "containerd" / "layer").write_bytes(b"x" * 4096)
    if lock_file:
        (folder / IN_USE).touch()
    stamp = time.time() - age_s
    os.utime(folder, (stamp, stamp))
    return folder


def test_only_folders_whose_lock_nobody_holds_go(tmp_path: Path) -> None:
    live = _folder(tmp_path, "live", lock_file=True, age_s=2 * UNLOCKED_GRACE_S)
    killed = _folder(tmp_path, "killed", lock_file=True)
    old_unlocked = _folder(tmp_path, "old", lock_file=False, age_s=2 * UNLOCKED_GRACE_S)
    being_made = _folder(tmp_path, "new", lock_file=False)
    other = tmp_path / "rpn"  # not a node folder's name
    other.mkdir()
    with (live / IN_USE).open() as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        removed = remove_stale_workdirs(tmp_path)
        assert sorted(removed) == [f"{killed} (0 MB)", f"{old_unlocked} (0 MB)"]
    assert live.is_dir() and being_made.is_dir() and other.is_dir()
    assert not killed.exists() and not old_unlocked.exists()
    # once its holder is gone, the live node's folder is a killed run's too
    assert remove_stale_workdirs(tmp_path) == [f"{live} (0 MB)"]
