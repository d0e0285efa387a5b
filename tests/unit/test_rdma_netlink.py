"""The RDMA netlink client against recorded kernel messages.

This machine's kernel has no RDMA netlink, so the kernel's side is played from bytes written
out by hand from the uapi header `rdma/rdma_netlink.h` (RDMA_NL_NLDEV = 5, SYS_GET = 6,
SYS_SET = 7, RDMA_NLDEV_SYS_ATTR_NETNS_MODE = 66; message type = 5 << 10 | command) and the
kernel's nldev handlers, over a socket pair that keeps message boundaries as netlink does.
Whether a live RDMA kernel answers exactly so is untested here.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.discovery import rdma_netlink
from rdmaplane.discovery.rdma_netlink import NetlinkError, RdmaNetlink
from rdmaplane.model import NetnsMode


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


def error_reply(code: int, request: bytes = SYS_GET) -> bytes:
    """NLMSG_ERROR carrying -code and the whole request (not capped)."""
    length = 16 + 4 + len(request)
    return (
        length.to_bytes(4, "little")
        + hexbytes("0200 0000 01000000 39300000")
        + (-code).to_bytes(4, "little", signed=True)
        + request
    )


class FakeKernel:
    """The other end of a socket pair: records each request, answers with the next script."""

    def __init__(self, *scripts: list[bytes] | None) -> None:
        self.scripts = list(scripts)  # None: never answer (until the client hangs up)
        self.requests: list[bytes] = []

    def connect(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        script = self.scripts.pop(0)

        def serve() -> None:
            with theirs:
                self.requests.append(theirs.recv(65536))
                if script is None:
                    theirs.recv(1)
                for datagram in script or ():
                    theirs.send(datagram)

        threading.Thread(target=serve, daemon=True).start()
        return ours


def test_request_bytes_are_what_the_rdma_tool_sends() -> None:
    assert rdma_netlink.request(rdma_netlink.RDMA_NLDEV_CMD_SYS_GET, 1) == SYS_GET
    attribute = rdma_netlink.u8_attribute(rdma_netlink.RDMA_NLDEV_SYS_ATTR_NETNS_MODE, 1)
    assert rdma_netlink.request(rdma_netlink.RDMA_NLDEV_CMD_SYS_SET, 1, attribute) == (
        SYS_SET_SHARED
    )


@pytest.mark.parametrize(("value", "mode"), [(1, NetnsMode.SHARED), (0, NetnsMode.EXCLUSIVE)])
def test_the_mode_as_the_kernel_answers(value: int, mode: NetnsMode) -> None:
    kernel = FakeKernel([sys_get_reply(value)])
    assert RdmaNetlink(kernel.connect).netns_mode() is mode
    assert kernel.requests == [SYS_GET]


def test_reply_and_acknowledgement_in_separate_datagrams() -> None:
    reply = sys_get_reply(0)
    kernel = FakeKernel([reply[:40], reply[40:]])
    assert RdmaNetlink(kernel.connect).netns_mode() is NetnsMode.EXCLUSIVE


def test_a_dump_style_answer_ends_with_done() -> None:
    """Kernels that served SYS_GET as a dump: NLM_F_MULTI data, then NLMSG_DONE."""
    data = hexbytes("""
        18000000 0614 0200 01000000 39300000   # NLM_F_MULTI
        0500 4200 00 000000
        14000000 0300 0200 01000000 39300000   # NLMSG_DONE
        00000000
    """)
    assert RdmaNetlink(FakeKernel([data]).connect).netns_mode() is NetnsMode.EXCLUSIVE


def test_answers_to_other_requests_are_skipped() -> None:
    kernel = FakeKernel([sys_get_reply(0, seq=7), sys_get_reply(1)])
    assert RdmaNetlink(kernel.connect).netns_mode() is NetnsMode.SHARED


def test_sequence_numbers_advance() -> None:
    kernel = FakeKernel([sys_get_reply(1)], [sys_get_reply(0, seq=2)])
    client = RdmaNetlink(kernel.connect)
    assert (client.netns_mode(), client.netns_mode()) == (NetnsMode.SHARED, NetnsMode.EXCLUSIVE)
    assert kernel.requests[1][8:12] == (2).to_bytes(4, "little")


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.EINVAL])
def test_a_kernel_without_sys_get_gives_no_answer(code: int) -> None:
    assert RdmaNetlink(FakeKernel([error_reply(code)]).connect).netns_mode() is None


def test_a_reply_without_the_attribute_gives_no_answer() -> None:
    ack_only = sys_get_reply(1)[40:]
    assert RdmaNetlink(FakeKernel([ack_only]).connect).netns_mode() is None


def test_no_rdma_netlink_here_gives_no_answer() -> None:
    def absent() -> socket.socket:
        raise OSError(errno.EPROTONOSUPPORT, "Protocol not supported")

    assert RdmaNetlink(absent).netns_mode() is None


def test_this_machines_kernel_is_asked_without_error() -> None:
    """The real socket: None where the kernel has no RDMA netlink (this machine), else a mode."""
    assert RdmaNetlink().netns_mode() in (None, NetnsMode.SHARED, NetnsMode.EXCLUSIVE)


@pytest.mark.parametrize(
    "script",
    [
        [b"\x28\x00\x00\x00\x06\x14"],  # truncated header
        [hexbytes("ff000000 0614 0000 01000000 39300000")],  # length past the end
        [hexbytes("18000000 0614 0000 01000000 39300000 ff00 4200 01000000")],  # bad nla_len
        [],  # the socket closes before anything comes
        None,  # nothing ever comes: the timeout ends it
    ],
)
def test_garbled_or_missing_answers_give_no_answer(
    script: list[bytes] | None, caplog: pytest.LogCaptureFixture
) -> None:
    client = RdmaNetlink(FakeKernel(script).connect, timeout_s=0.5)
    assert client.netns_mode() is None
    assert "asking RDMA netlink for the netns mode failed" in caplog.text


def test_setting_shared_sends_the_attribute_and_takes_the_ack() -> None:
    ack = hexbytes("""
        24000000 0200 0001 01000000 39300000
        00000000
        18000000 0714 0500 01000000 00000000
    """)
    kernel = FakeKernel([ack])
    RdmaNetlink(kernel.connect).set_netns_mode(NetnsMode.SHARED)
    assert kernel.requests == [SYS_SET_SHARED]


@pytest.mark.parametrize("code", [errno.EPERM, errno.EBUSY])
def test_refusals_carry_the_kernels_errno(code: int) -> None:
    kernel = FakeKernel([error_reply(code, SYS_SET_SHARED)])
    with pytest.raises(NetlinkError) as refused:
        RdmaNetlink(kernel.connect).set_netns_mode(NetnsMode.SHARED)
    assert refused.value.errno == code


def test_setting_without_rdma_netlink_is_an_error_not_a_crash() -> None:
    def absent() -> socket.socket:
        raise OSError(errno.EPROTONOSUPPORT, "Protocol not supported")

    with pytest.raises(NetlinkError) as refused:
        RdmaNetlink(absent).set_netns_mode(NetnsMode.SHARED)
    assert refused.value.errno == errno.EPROTONOSUPPORT


@given(st.binary(max_size=200))
def test_any_bytes_parse_or_fail_cleanly(data: bytes) -> None:
    with contextlib.suppress(ValueError, NetlinkError):
        rdma_netlink.parse(data, 1)
