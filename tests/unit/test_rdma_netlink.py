"""The RDMA netlink client against recorded kernel messages (`tests/rdma_kernel.py`: this
machine's kernel has no RDMA netlink; whether a live RDMA kernel answers exactly so is untested
here)."""

from __future__ import annotations

import contextlib
import errno
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.adapters.discovery import rdma_netlink
from rdmaplane.adapters.discovery.rdma_netlink import NetlinkError, RdmaNetlink
from rdmaplane.core.model import NetnsMode
from tests.rdma_kernel import (
    SYS_GET,
    SYS_SET_SHARED,
    FakeKernel,
    ack,
    error_reply,
    hexbytes,
    sys_get_reply,
)


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
    kernel = FakeKernel([ack(SYS_SET_SHARED)])
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
