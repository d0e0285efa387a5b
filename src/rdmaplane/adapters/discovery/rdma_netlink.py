"""RDMA netlink, the `rdma` tool's channel to the kernel: the RDMA subsystem's network-namespace
mode, asked (`rdma system show`) and set (`rdma system set netns shared`).

A tiny raw client, one request and its answer, no library (pyroute2 has no RDMA family). The
layout is the kernel's uapi header `rdma/rdma_netlink.h`: a `nlmsghdr` whose type is
`RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, command)`, no family header, then netlink attributes. The
kernel answers SYS_GET with one message carrying `RDMA_NLDEV_SYS_ATTR_NETNS_MODE` (u8, 1 =
shared) and, as asked, an acknowledgement; kernels that serve SYS_GET as a dump end with
NLMSG_DONE instead. SYS_SET needs CAP_NET_ADMIN, and the kernel refuses it (EBUSY) while any
network namespace besides the initial one exists.

Tested against message bytes built from those constants: the development machine's kernel has
no RDMA netlink (`socket(AF_NETLINK, …, NETLINK_RDMA)` fails with EPROTONOSUPPORT), so this
client has not been run against a live RDMA kernel.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rdmaplane.core.errors import RdmaplaneError
from rdmaplane.core.model import NetnsMode

log = logging.getLogger("rdmaplane.adapters.discovery.netlink")

NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5
RDMA_NLDEV_CMD_SYS_GET = 6
RDMA_NLDEV_CMD_SYS_SET = 7
RDMA_NLDEV_SYS_ATTR_NETNS_MODE = 66
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER

HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
ATTRIBUTE = struct.Struct("=HH")  # nlattr: length, type
TIMEOUT_S = 2.0
MAX_REPLY = 65536

# errnos that say this kernel (or this sandbox) has no RDMA netlink to ask
_ABSENT = (errno.EPROTONOSUPPORT, errno.EAFNOSUPPORT, errno.EINVAL, errno.EOPNOTSUPP)


def message_type(command: int) -> int:
    """`RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, command)`."""
    return (RDMA_NL_NLDEV << 10) + command


def request(command: int, seq: int, attributes: bytes = b"") -> bytes:
    """One request message, asking for an acknowledgement."""
    flags = NLM_F_REQUEST | NLM_F_ACK
    return HEADER.pack(HEADER.size + len(attributes), message_type(command), flags, seq, 0) + (
        attributes
    )


def u8_attribute(kind: int, value: int) -> bytes:
    """A u8 netlink attribute, padded to 4 bytes."""
    return ATTRIBUTE.pack(ATTRIBUTE.size + 1, kind) + bytes([value]) + bytes(3)


class NetlinkError(RdmaplaneError, OSError):
    """The kernel (or the socket) refused; `errno` says why."""


@dataclass(frozen=True, slots=True)
class Reply:
    """What the kernel answered to one request: the attributes of its data messages (type →
    payload), and whether it ended the exchange (an acknowledgement or NLMSG_DONE)."""

    attributes: dict[int, bytes]
    done: bool


def parse(data: bytes, seq: int, into: dict[int, bytes] | None = None) -> Reply:
    """Read one datagram of the kernel's answer to request `seq`; raises NetlinkError for an
    error message, ValueError for bytes that are no netlink messages."""
    found = into if into is not None else {}
    done = False
    for kind, msg_seq, payload in _messages(data):
        if msg_seq != seq:
            continue  # an answer to an earlier request on this socket
        if kind == NLMSG_ERROR:
            if len(payload) < 4:
                raise ValueError("NLMSG_ERROR without an error code")
            code = -struct.unpack_from("=i", payload)[0]
            if code:
                raise NetlinkError(code, os.strerror(code))
            done = True
        elif kind == NLMSG_DONE:
            done = True
        else:
            found.update(_attributes(payload))
    return Reply(found, done)


def _messages(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    offset = 0
    while offset + HEADER.size <= len(data):
        length, kind, _flags, seq, _port = HEADER.unpack_from(data, offset)
        if length < HEADER.size or offset + length > len(data):
            raise ValueError(f"netlink message of length {length} at byte {offset}")
        yield kind, seq, data[offset + HEADER.size : offset + length]
        offset += _aligned(length)


def _attributes(payload: bytes) -> Iterator[tuple[int, bytes]]:
    offset = 0
    while offset + ATTRIBUTE.size <= len(payload):
        length, kind = ATTRIBUTE.unpack_from(payload, offset)
        if length < ATTRIBUTE.size or offset + length > len(payload):
            raise ValueError(f"netlink attribute of length {length} at byte {offset}")
        yield kind & NLA_TYPE_MASK, payload[offset + ATTRIBUTE.size : offset + length]
        offset += _aligned(length)


def _aligned(n: int) -> int:
    return (n + 3) & ~3


def connect() -> socket.socket:
    """A netlink socket to the kernel's RDMA family."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_RDMA)
    try:
        sock.connect((0, 0))  # port 0: the kernel
    except OSError:
        sock.close()
        raise
    return sock


class RdmaNetlink:
    """Ask and set the RDMA network-namespace mode. `connect` makes the socket (tests pass one
    end of a socket pair that answers with recorded messages)."""

    def __init__(
        self, connect: Callable[[], socket.socket] = connect, timeout_s: float = TIMEOUT_S
    ) -> None:
        self._connect = connect
        self.timeout_s = timeout_s
        self._seq = 0

    def netns_mode(self) -> NetnsMode | None:
        """The mode as the kernel says it; None when there is no answer here: no RDMA netlink
        (no ib_core, a sandbox), a kernel without SYS_GET, a reply without the attribute, or
        a failed exchange (logged: the caller falls back on ib_core's parameter)."""
        try:
            found = self._exchange(RDMA_NLDEV_CMD_SYS_GET)
        except NetlinkError as e:
            if e.errno not in _ABSENT:
                log.warning("asking RDMA netlink for the netns mode failed: %s", e.strerror)
            return None
        value = found.get(RDMA_NLDEV_SYS_ATTR_NETNS_MODE)
        if not value:
            return None
        return NetnsMode.SHARED if value[0] else NetnsMode.EXCLUSIVE

    def set_netns_mode(self, mode: NetnsMode) -> None:
        """Switch the mode; NetlinkError names why the kernel refused (EPERM: no
        CAP_NET_ADMIN; EBUSY: network namespaces other than the initial one exist)."""
        if mode is NetnsMode.UNKNOWN:
            raise ValueError("the netns mode to set is shared or exclusive")
        value = 1 if mode is NetnsMode.SHARED else 0
        self._exchange(RDMA_NLDEV_CMD_SYS_SET, u8_attribute(RDMA_NLDEV_SYS_ATTR_NETNS_MODE, value))

    def _exchange(self, command: int, attributes: bytes = b"") -> dict[int, bytes]:
        self._seq += 1
        try:
            sock = self._connect()
        except OSError as e:
            raise NetlinkError(e.errno or errno.EIO, f"no RDMA netlink socket: {e}") from e
        with sock:
            sock.settimeout(self.timeout_s)
            try:
                sock.send(request(command, self._seq, attributes))
                found: dict[int, bytes] = {}
                while True:
                    data = sock.recv(MAX_REPLY)
                    if not data:
                        raise ValueError("the socket closed before the answer ended")
                    if parse(data, self._seq, found).done:
                        break
            except NetlinkError:
                raise
            except (OSError, ValueError) as e:  # a timeout, a closed socket, garbled bytes
                code = e.errno if isinstance(e, OSError) and e.errno else errno.EIO
                raise NetlinkError(code, f"RDMA netlink: {e}") from e
        return found
