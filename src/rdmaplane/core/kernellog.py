"""mlx5's own word on its health, from the kernel log: a log line in, an event out. Pure.

The mlx5 driver logs as `mlx5_core <PCI function>: <function>:<line>:(pid N): <message>`
(`drivers/net/ethernet/mellanox/mlx5/core/health.c`, `cmd.c`, `events.c`). The messages
recognised here, each a reason of the port health rule table (`rdmaplane.core.porthealth`):

- `FirmwareFatal`: `Fatal error <n> detected`, and the health syndrome printed after it
  (`synd 0x<n>: <what>`): the firmware stopped; the device is reset, or dead;
- `HealthCompromised`: `device's health compromised - reached miss count`: the firmware's
  health counter stopped moving;
- `CommandTimeout`: `<COMMAND>(0x<op>) timeout. Will cause a leak of a command resource`: the
  firmware did not answer a command;
- `PcieSlotPower`: `Detected insufficient power on the PCIe slot (<n>W).`: the card may
  throttle.

A line is taken from `/dev/kmsg` (`<prefix>,<seq>,<usec>,<flags>;<message>`, continuation
lines ` KEY=value`) or a syslog file (`... kernel: [   17.98] mlx5_core ...`): the driver's
part is found wherever it starts. The event keeps that part, quoted in the symptom.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FIRMWARE_FATAL = "FirmwareFatal"
HEALTH_COMPROMISED = "HealthCompromised"
COMMAND_TIMEOUT = "CommandTimeout"
PCIE_SLOT_POWER = "PcieSlotPower"
REASONS = (FIRMWARE_FATAL, HEALTH_COMPROMISED, COMMAND_TIMEOUT, PCIE_SLOT_POWER)

MAX_QUOTED = 240  # characters of the line kept for the symptom
_DRIVER = re.compile(
    r"mlx5_core (?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])(?: [^ :]+)?: "
    r"(?P<message>.*)"
)
_MESSAGES = (
    (FIRMWARE_FATAL, re.compile(r"\bFatal error \d+ detected|\bsynd 0x[0-9a-fA-F]+: ")),
    (HEALTH_COMPROMISED, re.compile(r"health compromised - reached miss count")),
    (COMMAND_TIMEOUT, re.compile(r"\(0x[0-9a-fA-F]+\) timeout\. Will cause a leak")),
    (PCIE_SLOT_POWER, re.compile(r"insufficient power on the PCIe slot")),
)


@dataclass(frozen=True, slots=True)
class KernelEvent:
    """One recognised line: when it was read (the caller's clock), the PCI function the driver
    named, the reason, and the driver's part of the line."""

    at: float
    pci: str
    reason: str
    line: str

    @property
    def quoted(self) -> str:
        text = self.line if len(self.line) <= MAX_QUOTED else self.line[: MAX_QUOTED - 1] + "…"
        return f'kernel: "{text}"'


def recognise(line: str, at: float) -> KernelEvent | None:
    """The event a log line tells of, or None (not mlx5's, or nothing the rules read)."""
    found = _DRIVER.search(kmsg_text(line))
    if found is None:
        return None
    message = found["message"]
    for reason, pattern in _MESSAGES:
        if pattern.search(message):
            driver_part = found.group(0).rstrip()
            return KernelEvent(at, found["pci"].lower(), reason, driver_part)
    return None


def kmsg_text(record: str) -> str:
    """A `/dev/kmsg` record's message (the header and the ` KEY=value` lines dropped); any
    other line as it is."""
    first = record.split("\n", 1)[0]
    head, sep, message = first.partition(";")
    if sep and head.count(",") >= 3 and head.split(",", 1)[0].isdigit():
        return message
    return first
