"""The fault notice: a real SIGTERM to a real process, the downward-API annotations file as the
kubelet writes it (Go-quoted values, swapped in atomically), and a pod without that volume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rdmaplane import train
from rdmaplane.train import notice as N
from tests.train.annotations import FAULT, kubelet_format, write_like_kubelet


def test_parse_annotations_reads_go_quoted_json():
    text = kubelet_format({"a": "plain", N.ANNOTATION: json.dumps(FAULT), "kubernetes.io/x": ""})
    parsed = train.parse_annotations(text + "garbage line\n")
    assert json.loads(parsed[N.ANNOTATION]) == FAULT
    assert parsed["a"] == "plain" and parsed["kubernetes.io/x"] == ""


def test_annotation_appearing_fires_once_with_the_fault(tmp_path: Path):
    path = tmp_path / "annotations"
    write_like_kubelet(path, {"other": "x"})
    notice = train.FaultNotice(path, poll_s=0.05, signals=())
    with notice:
        assert not notice.wait(0.2)
        write_like_kubelet(path, {"other": "x", N.ANNOTATION: json.dumps(FAULT)})
        assert notice.wait(10)
    assert notice.reason == f"annotation {N.ANNOTATION}"
    assert notice.fault == FAULT


def test_a_notice_the_checkpoint_answered_does_not_fire_a_new_fault_does(tmp_path: Path, capfd):
    """A worker restarted in the same pod finds the annotation it already answered."""
    path = tmp_path / "annotations"
    write_like_kubelet(path, {N.ANNOTATION: json.dumps(FAULT)})
    answered = N.notice_id(json.dumps(FAULT))
    assert answered == "mlx5_3:1 fatal since 2026-11-30T13:00:00Z"
    notice = train.FaultNotice(path, poll_s=0.05, signals=(), answered={answered, "gone"})
    with notice:
        reworded = {**FAULT, "reason": "port 1 DOWN (POLLING)"}  # the same fault, reworded
        write_like_kubelet(path, {N.ANNOTATION: json.dumps(reworded)})
        assert not notice.wait(0.3)
        assert notice.answered == {answered}  # still in the file; "gone" is not
        new = {**FAULT, "since": "2026-11-30T14:00:00Z"}
        write_like_kubelet(path, {N.ANNOTATION: json.dumps(new)})
        assert notice.wait(10)
    assert notice.fault == new
    assert notice.answered == {"mlx5_3:1 fatal since 2026-11-30T14:00:00Z"}
    err = capfd.readouterr().err
    assert err.count(f"fault notice {answered} was answered by the checkpoint") == 2


def test_the_class_changing_is_a_new_notice_and_other_values_are_their_own_id():
    fatal = N.notice_id(json.dumps(FAULT))
    assert N.notice_id(json.dumps({**FAULT, "class": "degraded"})) != fatal
    assert N.notice_id("drain me") == "drain me"
    assert N.notice_id('{"hca": "mlx5_0"}') == '{"hca": "mlx5_0"}'


def test_missing_annotations_volume_warns_once_and_sigterm_still_works(tmp_path: Path):
    notice = train.FaultNotice(tmp_path / "nowhere", poll_s=0.05, signals=(signal.SIGUSR1,))
    with pytest.warns(train.NoticeWarning, match="nowhere: No such file or directory: mount"):
        notice.start()
    try:
        time.sleep(0.2)  # further polls do not warn again (pytest.warns would not see them)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert notice.wait(10)
        assert notice.reason == "SIGUSR1"
    finally:
        notice.stop()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL  # the old handler is back


LOOP = textwrap.dedent(
    """
    import sys, time
    from rdmaplane import train

    folder, annotations = sys.argv[1], sys.argv[2]
    resumed = train.load_object(folder)
    step, total = resumed if resumed else (0, 0)
    print(f"start {step}", flush=True)
    with train.FaultNotice(annotations, poll_s=0.05) as notice:
        while step < 3_000:
            total += step
            step += 1
            if step % 100 == 0:
                train.save_object(folder, step, total)
            if notice:
                train.save_object(folder, step, total)
                print(f"saved {step} ({notice.reason})", flush=True)
                train.exit_for_restart()
            time.sleep(0.001)
    print(f"done {step} {total}", flush=True)
    """
)


def _start(tmp_path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", LOOP, str(tmp_path / "ckpt"), str(tmp_path / "annotations")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_step(tmp_path: Path, at_least: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        found = train.latest(tmp_path / "ckpt")
        if found is not None and found.step >= at_least:
            return
        assert time.monotonic() < deadline, "the loop made no progress"
        time.sleep(0.05)


@pytest.mark.parametrize("trigger", ["SIGTERM", "annotation"])
def test_notice_saves_exits_75_and_the_restart_resumes_exactly(tmp_path: Path, trigger: str):
    process = _start(tmp_path)
    _wait_for_step(tmp_path, 200)
    if trigger == "SIGTERM":
        process.send_signal(signal.SIGTERM)
    else:
        write_like_kubelet(tmp_path / "annotations", {N.ANNOTATION: json.dumps(FAULT)})
    out, err = process.communicate(timeout=60)
    assert process.returncode == train.EXIT_RESTART, err
    saved = int(out.split("saved ")[1].split()[0])
    assert train.load_object(tmp_path / "ckpt") == (saved, sum(range(saved)))
    if trigger == "annotation":
        (tmp_path / "annotations").unlink()  # the replacement pod has no notice
    again = _start(tmp_path)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert out.splitlines()[0] == f"start {saved}"
    assert out.splitlines()[-1] == f"done 3000 {sum(range(3_000))}"


# A launcher that, like torchrun, turns any failed worker into its own exit 1.
LAUNCHER = "import subprocess, sys; sys.exit(1 if subprocess.call(sys.argv[1:]) else 0)"


def test_run_keeps_exit_75_through_a_launcher(tmp_path: Path):
    args = [sys.executable, "-c", LOOP, str(tmp_path / "ckpt"), str(tmp_path / "annotations")]
    wrapped = subprocess.Popen(
        [sys.executable, "-m", "rdmaplane.train.run", "--", sys.executable, "-c", LAUNCHER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_step(tmp_path, 200)
    write_like_kubelet(tmp_path / "annotations", {N.ANNOTATION: json.dumps(FAULT)})
    _, err = wrapped.communicate(timeout=60)
    assert wrapped.returncode == train.EXIT_RESTART, err


def test_run_exits_0_when_the_launcher_restarted_the_workers_and_they_finished():
    """torchrun --max-restarts: a round exited 75, the next finished; the job succeeded."""
    worker = "from rdmaplane.train import exit_for_restart; exit_for_restart()"
    restarting = f"import subprocess, sys; subprocess.call([sys.executable, '-c', {worker!r}])"
    result = subprocess.run(
        [sys.executable, "-m", "rdmaplane.train.run", "--", sys.executable, "-c", restarting],
        timeout=60,
    )
    assert result.returncode == 0


def test_a_sigkilled_run_leaves_nothing_in_the_temporary_folder(tmp_path: Path):
    wrapped = subprocess.Popen(
        [sys.executable, "-m", "rdmaplane.train.run", "--", "sleep", "60"],
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    deadline = time.monotonic() + 60
    children = Path(f"/proc/{wrapped.pid}/task/{wrapped.pid}/children")
    while not children.read_text().split():  # the wrapper is set up once `sleep` runs
        assert time.monotonic() < deadline
        time.sleep(0.05)
    sleeper = int(children.read_text().split()[0])
    wrapped.kill()
    wrapped.wait(60)
    os.kill(sleeper, signal.SIGKILL)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("script", "code"),
    [("raise SystemExit(3)", 3), ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137)],
)
def test_run_passes_other_exits_through(script: str, code: int):
    result = subprocess.run(
        [sys.executable, "-m", "rdmaplane.train.run", "--", sys.executable, "-c", script],
        timeout=60,
    )
    assert result.returncode == code


def test_run_without_a_command_is_a_usage_error():
    result = subprocess.run(
        [sys.executable, "-m", "rdmaplane.train.run"], capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stderr.count("\n")) == (2, 1)
    assert "usage: python -m rdmaplane.train.run -- COMMAND" in result.stderr
