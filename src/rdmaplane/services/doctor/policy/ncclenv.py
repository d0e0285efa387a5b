"""How NCCL reads its device-list variables (`NCCL_IB_HCA`, `NCCL_SOCKET_IFNAME`).

A comma list of `name[:port]`; a leading `^` excludes the listed devices, a leading `=` (after
`^` if both) asks for exact names. Without `=`, every entry is a prefix: `mlx5_1` also selects
`mlx5_10` and `mlx5_11`. Pure functions; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DeviceList:
    exclude: bool
    exact: bool
    entries: tuple[tuple[str, int | None], ...]  # (name, port) — port None = every port


def parse_device_list(value: str) -> DeviceList:
    """Raises ValueError naming the entry when a port is not a number."""
    text = value.strip()
    exclude = text.startswith("^")
    text = text.removeprefix("^")
    exact = text.startswith("=")
    text = text.removeprefix("=")
    entries: list[tuple[str, int | None]] = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, port = item.partition(":")
        if sep and not port.isdigit():
            raise ValueError(f"entry {item!r}: port {port!r} is not a number")
        entries.append((name, int(port) if sep else None))
    return DeviceList(exclude, exact, tuple(entries))


def entry_matches(entry: str, name: str, exact: bool) -> bool:
    return name == entry if exact else name.startswith(entry)


def selected(spec: DeviceList, names: list[str]) -> list[str]:
    """The device names NCCL would use out of `names`."""

    def listed(n: str) -> bool:
        return any(entry_matches(e, n, spec.exact) for e, _ in spec.entries)

    return [n for n in names if listed(n) != spec.exclude]


def meant(spec: DeviceList, names: list[str]) -> list[str]:
    """The devices of `names` the value means: an entry naming a device exactly means that one
    (even where, as a prefix, NCCL takes more: `mlx5_1` and `mlx5_10`), any other entry what it
    selects; in the order of `names`."""
    if spec.exclude or spec.exact:
        return selected(spec, names)
    wanted = {
        n
        for e, _ in spec.entries
        for n in ([e] if e in names else selected(DeviceList(False, False, ((e, None),)), names))
    }
    return [n for n in names if n in wanted]


def ambiguous_entries(spec: DeviceList, names: list[str]) -> dict[str, list[str]]:
    """Entries naming a device that, as prefixes, select others too (`mlx5_1` → 10, 11). An
    entry naming no device (`mlx5`) is a prefix on purpose: what it selects is judged as such."""
    if spec.exact:
        return {}
    out: dict[str, list[str]] = {}
    for entry, _ in spec.entries:
        extra = [n for n in names if n != entry and n.startswith(entry)]
        if extra and entry in names:
            out[entry] = extra
    return out
