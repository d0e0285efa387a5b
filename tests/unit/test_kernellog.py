"""mlx5's health lines (`rdmaplane.core.kernellog`) and the reader of new log lines
(`rdmaplane.adapters.discovery.kernellog`), on recorded lines: never the host's own log."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.adapters.discovery.kernellog import KernelLog
from rdmaplane.core import kernellog as K

# As the driver prints them (drivers/net/ethernet/mellanox/mlx5/core/health.c, cmd.c,
# events.c), in /dev/kmsg's record format and in a syslog file's.
RECORDED = [
    (
        "3,1923,51893214,-;mlx5_core 0000:1a:00.0: mlx5_health_try_recover:303:(pid 1421): "
        "Fatal error 1 detected\n SUBSYSTEM=pci\n DEVICE=+pci:0000:1a:00.0",
        "0000:1a:00.0",
        K.FIRMWARE_FATAL,
    ),
    (
        "3,1925,51893300,-;mlx5_core 0000:1a:00.0: print_health_info:431:(pid 1421): synd 0x1: "
        "firmware internal error",
        "0000:1a:00.0",
        K.FIRMWARE_FATAL,
    ),
    (
        "Dec  1 10:12:01 gpu-017 kernel: [ 8123.123456] mlx5_core 0000:3D:00.1: poll_health:"
        "812:(pid 0): device's health compromised - reached miss count",
        "0000:3d:00.1",
        K.HEALTH_COMPROMISED,
    ),
    (
        "4,2210,61893214,-;mlx5_core 0000:9b:00.0 ens9f0np0: cmd_work_handler:1053:(pid 77): "
        "QUERY_VPORT_COUNTER(0x770) timeout. Will cause a leak of a command resource",
        "0000:9b:00.0",
        K.COMMAND_TIMEOUT,
    ),
    (
        "4,1001,18000000,-;mlx5_core 0000:c1:00.0: mlx5_pcie_event:301:(pid 9): Detected "
        "insufficient power on the PCIe slot (27W).",
        "0000:c1:00.0",
        K.PCIE_SLOT_POWER,
    ),
]
NOT_HEALTH = [
    "6,900,1000000,-;mlx5_core 0000:1a:00.0: E-Switch: Total vports 10, per vport: max uc(128)",
    "6,901,1000001,-;mlx5_core 0000:1a:00.0: Port module event: module 0, Cable plugged",
    "3,902,1000002,-;nvme nvme0: Fatal error 1 detected",  # not mlx5's
    "Dec  1 10:12:01 gpu-017 sshd[123]: Accepted publickey for root",
]


@pytest.mark.parametrize(("line", "pci", "reason"), RECORDED)
def test_recorded_lines_become_events_with_the_line_quoted(line, pci, reason):
    event = K.recognise(line, at=5.0)
    assert event is not None and (event.pci, event.reason, event.at) == (pci, reason, 5.0)
    assert event.line.startswith("mlx5_core ") and "SUBSYSTEM" not in event.line
    assert event.quoted == f'kernel: "{event.line}"'


@pytest.mark.parametrize("line", NOT_HEALTH)
def test_other_lines_are_no_event(line):
    assert K.recognise(line, at=0.0) is None


@given(st.text(max_size=400))
def test_any_line_is_read_without_error_and_quoted_short(text):
    event = K.recognise("mlx5_core 0000:01:00.0: x: Fatal error 3 detected " + text, 0.0)
    assert event is not None and len(event.quoted) <= K.MAX_QUOTED + len('kernel: ""')
    K.recognise(text, 0.0)


def test_a_syslog_file_is_read_from_its_end_and_again_after_rotation(tmp_path):
    """Lines already there are old news; new lines become events, kept for `keep_s`; a file
    that shrank is read from its start; a partial last line waits for its end."""
    log = tmp_path / "kern.log"
    log.write_text(RECORDED[2][0] + "\n")
    now = [0.0]
    reader = KernelLog(log, keep_s=300.0, clock=lambda: now[0])
    assert reader.read() == ()
    with log.open("a") as f:
        f.write(RECORDED[0][0].split("\n")[0] + "\nmlx5_core 0000:c1:00.0: x: Detected insuff")
    assert [e.reason for e in reader.read()] == [K.FIRMWARE_FATAL]
    with log.open("a") as f:
        f.write("icient power on the PCIe slot (27W).\n")
    now[0] = 10.0
    assert [e.reason for e in reader.read()] == [K.FIRMWARE_FATAL, K.PCIE_SLOT_POWER]
    log.write_text(RECORDED[3][0] + "\n")  # rotated: a new, shorter file
    now[0] = 301.0
    assert [e.reason for e in reader.read()] == [K.PCIE_SLOT_POWER, K.COMMAND_TIMEOUT]
    reader.close()


def test_a_log_that_cannot_be_opened_is_tried_again(tmp_path, caplog):
    path = tmp_path / "kmsg"
    reader = KernelLog(path, keep_s=60.0, clock=lambda: 0.0)
    assert reader.read() == () and reader.read() == ()
    assert sum("cannot read the kernel log" in r.message for r in caplog.records) == 1
    path.write_text("")
    assert reader.read() == ()
    with path.open("a") as f:
        f.write(RECORDED[4][0] + "\n")
    assert [e.reason for e in reader.read()] == [K.PCIE_SLOT_POWER]
    reader.close()
