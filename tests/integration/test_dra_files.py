"""The DRA driver's files are replaced atomically: a writer killed at any moment leaves the old
file or the new one, whole, and at most a temporary file that the driver removes at start."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from rdmaplane.services.dra import files

WRITER = """
import sys
from pathlib import Path
from rdmaplane.services.dra.files import write_json
target = Path(sys.argv[1])
n = 0
while True:
    n += 1
    write_json(target, {"n": n, "pad": "x" * (n % 5000) * 20})
"""


def test_a_writer_killed_anywhere_leaves_a_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "spec.json"
    files.write_json(target, {"n": 0, "pad": ""})
    for kill_after in (0.0, 0.005, 0.02):
        replaced = target.stat().st_ino
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(target)])
        deadline = time.monotonic() + 60
        while target.stat().st_ino == replaced:  # until this writer has replaced it once
            assert time.monotonic() < deadline, "the writer never wrote"
            time.sleep(0.01)
        time.sleep(kill_after)
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        content = json.loads(target.read_text())  # never torn: it parses and is consistent
        assert content["n"] > 0 and content["pad"] == "x" * (content["n"] % 5000) * 20
        for left in files.leftovers(tmp_path):
            files.remove(left)
    assert [p.name for p in tmp_path.iterdir()] == ["spec.json"]


def test_write_creates_its_folder_and_remove_says_whether_there_was_a_file(
    tmp_path: Path,
) -> None:
    target = tmp_path / "cdi" / "a.json"
    files.write_json(target, {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}
    assert files.remove(target) is True
    assert files.remove(target) is False
    assert list(files.leftovers(tmp_path / "missing")) == []
