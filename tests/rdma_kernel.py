"""The kernel's side of RDMA netlink, played from recorded bytes.

This machine's kernel has no RDMA netlink, so the messages are written out by hand from the
uapi header `rdma/rdma_netlink.h` (RDMA_NL_NLDEV = 5, SYS_GET = 6, SYS_SET = 7,
RDMA_NLDEV_SYS_ATTR_NETNS_MODE = 66; message type = 5 << 10 | command) and the kernel's nldev
handlers, and served over a socket pair that keeps message boundaries as netlink does.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


def hexbytes(text: str) -> bytes:
    return bytes.fromhex("".join(line.split("#")[0] for line in text.splitlines()))


# `rdma system show`: SYS_GET, NLM_F_REQUEST | NLM_F_ACK, sequence 1
SYS_GET = hexbytes("""
    10000000 0614 0500 01000000 00000000  # len 16, type 0x1406, flags 5, seq 1, port 0
""")
# `rdma system set netns shared`: SYS_SET with the u8 attribute 66 = 1, padded to 4 bytes
SYS_SET_SHARED = hexbytes("""
    18000000 0714 0500 01000000 00000000  # len 24, type 0x1407
    0500 4200 01 000000                   # nla_len 5, NETNS_MODE, 1, padding
""")


def sys_get_reply(mode: int, seq: int = 1) -> bytes:
    """A 6.x kernel's answer (nldev_sys_get_doit) to port 12345: NETNS_MODE, PRIVILEGED_QKEY_MODE
    (96) and COPY_ON_FORK (93), then the acknowledgement the request asked for."""
    s = f"{seq:02x}"
    return hexbytes(f"""
        28000000 0614 0000 {s}000000 39300000  # len 40, SYS_GET, seq, port 12345
        0500 4200 {mode:02x} 000000            # NETNS_MODE
        0500 6000 00 000000                    # PRIVILEGED_QKEY_MODE
        0500 5d00 01 000000                    # COPY_ON_FORK
        24000000 0200 0001 {s}000000 39300000  # NLMSG_ERROR, NLM_F_CAPPED
        00000000                               # error 0: the acknowledgement
        10000000 0614 0500 {s}000000 00000000  # the request's header
    """)


def ack(request: bytes) -> bytes:
    """The acknowledgement of a request that succeeded (NLMSG_ERROR, error 0, capped)."""
    return (
        (16 + 4 + 16).to_bytes(4, "little")
        + hexbytes("0200 0001")
        + request[8:12]
        + hexbytes("39300000 00000000")
        + request[:16]
    )


def error_reply(code: int, request: bytes = SYS_GET) -> bytes:
    """NLMSG_ERROR carrying -code and the whole request (not capped)."""
    length = 16 + 4 + len(request)
    return (
        length.to_bytes(4, "little")
        + hexbytes("0200 0000 01000000 39300000")
        + (-code).to_bytes(4, "little", signed=True)
        + request
    )


Script = list[bytes] | Callable[[bytes], list[bytes]] | None


class FakeKernel:
    """The other end of a socket pair: records each request, answers with the next script (the
    datagrams to send, a function of the request giving them, or None: never answer until the
    client hangs up)."""

    def __init__(self, *scripts: Script) -> None:
        self.scripts = list(scripts)
        self.requests: list[bytes] = []

    def connect(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        script = self.scripts.pop(0)

        def serve() -> None:
            with theirs:
                request = theirs.recv(65536)
                self.requests.append(request)
                if script is None:
                    theirs.recv(1)
                for datagram in script(request) if callable(script) else script or ():
                    theirs.send(datagram)

        threading.Thread(target=serve, daemon=True).start()
        return ours
