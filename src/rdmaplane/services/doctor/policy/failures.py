"""What RDMA failures look like in the text people have, what they mean, and how to fix them.

One table of InfiniBand work-completion statuses (`enum ibv_wc_status`, the numbers every verbs
user prints) and one list of known failure messages, shared by the NCCL log, nccl-tests and
perftest readers so that the same failure gets the same name, cause and fix wherever it shows.
The wordings are those of the releases that print them (see docs/doctor.md for the table):

- NCCL ≤ 2.9   `NET/IB : Got completion with error 12, opcode 0, len 0, vendor err 129`
- NCCL 2.10–19 `NET/IB : Got completion from peer 10.0.0.2<43211> with error 12, opcode …`
- NCCL 2.20–27 `NET/IB: Got completion from peer … with status=12 opcode=0 len=0 vendor err 129 …`
- NCCL ≥ 2.28  `… with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RDMA_WRITE(1) reqSize=…`
- perftest ≤ 25 ` Failed status 12: wr_id 0 syndrom 0x81`; ≥ 26 ` Failed status-transport retry
  counter exceeded (12): wr_id 0 syndrom 0x81`

Pure functions over strings; no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rdmaplane.services.doctor.policy.verdict import Finding, Status


@dataclass(frozen=True, slots=True)
class WcStatus:
    """One `ibv_wc_status`: its number, libibverbs' symbol and text, what it means here."""

    code: int
    symbol: str
    text: str  # ibv_wc_status_str()
    cause: str
    fix: str


_PEER_FIRST = "find the first error of the run (this rank's and the peer's log) and fix that"
_SAME_SOFTWARE = (
    "run one NCCL version (and one perftest version) on every node; check NCCL_IB_* settings "
    "are the same everywhere"
)
_RD_ONLY = "a reliable-datagram (RD) status: NCCL and perftest use RC queue pairs and never see it"
_RD_FIX = "report it with the full log: it points at a driver or firmware fault"

WC_STATUSES: dict[int, WcStatus] = {
    s.code: s
    for s in (
        WcStatus(
            1,
            "IBV_WC_LOC_LEN_ERR",
            "local length error",
            "a message was larger than the receive buffer posted for it: the two sides "
            "disagree about buffer sizes (different versions or settings)",
            _SAME_SOFTWARE,
        ),
        WcStatus(
            2,
            "IBV_WC_LOC_QP_OP_ERR",
            "local QP operation error",
            "the local queue pair could not execute a work request (inline or scatter size "
            "beyond what the HCA supports, or the QP was already in error)",
            _PEER_FIRST + "; " + _SAME_SOFTWARE,
        ),
        WcStatus(3, "IBV_WC_LOC_EEC_OP_ERR", "local EE context operation error", _RD_ONLY, _RD_FIX),
        WcStatus(
            4,
            "IBV_WC_LOC_PROT_ERR",
            "local protection error",
            "the HCA could not access a local buffer through its memory registration: for GPU "
            "buffers, GPUDirect RDMA registration is broken (nvidia_peermem not loaded, "
            "DMA-BUF unsupported) or the memory was freed while in flight",
            "load nvidia_peermem on the node (GPU operator: driver.rdma.enabled=true) or use "
            "DMA-BUF (open kernel module, NCCL >= 2.19); NCCL_NET_GDR_LEVEL=LOC confirms it "
            "by staging through host memory; check memlock / IPC_LOCK (`rdmaplane doctor`)",
        ),
        WcStatus(
            5,
            "IBV_WC_WR_FLUSH_ERR",
            "Work Request Flushed Error",
            "the queue pair had already failed, so every request still queued was flushed: "
            "a consequence, not the cause (often the peer process died or hit its own error)",
            _PEER_FIRST,
        ),
        WcStatus(
            6,
            "IBV_WC_MW_BIND_ERR",
            "memory management operation error",
            "a memory-window bind failed (NCCL and perftest bind no memory windows)",
            _RD_FIX,
        ),
        WcStatus(
            7,
            "IBV_WC_BAD_RESP_ERR",
            "bad response error",
            "the peer answered with an unexpected transport response: a firmware or fabric "
            "fault between the two HCAs",
            "compare firmware versions (`fw_ver`), check cables and the port error counters on "
            "both ends (`rdmaplane agent` metrics, `ibstat`)",
        ),
        WcStatus(
            8,
            "IBV_WC_LOC_ACCESS_ERR",
            "local access error",
            "an incoming write touched local memory its registration does not allow "
            "(registration flags, or a GPU buffer whose GPUDirect registration broke)",
            "same as status 4: check nvidia_peermem / DMA-BUF, then " + _SAME_SOFTWARE,
        ),
        WcStatus(
            9,
            "IBV_WC_REM_INV_REQ_ERR",
            "remote invalid request error",
            "the peer rejected the request as invalid (an operation or size it was not set up "
            "for): the two sides run different versions or settings",
            _SAME_SOFTWARE,
        ),
        WcStatus(
            10,
            "IBV_WC_REM_ACCESS_ERR",
            "remote access error",
            "the peer refused access to its memory (remote key invalid or out of range): its "
            "buffer registration failed or was dropped, e.g. GPUDirect RDMA broken on the peer "
            "node, or the peer process restarted",
            "check the peer's log for its first error; load nvidia_peermem (or use DMA-BUF) on "
            "every node; " + _SAME_SOFTWARE,
        ),
        WcStatus(
            11,
            "IBV_WC_REM_OP_ERR",
            "remote operation error",
            "the peer could not complete the operation on its side (its receive queue or "
            "memory failed)",
            _PEER_FIRST,
        ),
        WcStatus(
            12,
            "IBV_WC_RETRY_EXC_ERR",
            "transport retry counter exceeded",
            "the peer never acknowledged: no working path between the two ports (a wrong or "
            "per-node different RoCE GID index, link down, routing between subnets, drops from "
            "PFC/ECN or MTU mismatches) or the peer process died",
            "use one valid RoCE v2 NCCL_IB_GID_INDEX on every node (`rdmaplane doctor`), check "
            "both links and their error counters, PFC/ECN and MTU on the fabric; on very large "
            "fabrics raise NCCL_IB_TIMEOUT",
        ),
        WcStatus(
            13,
            "IBV_WC_RNR_RETRY_EXC_ERR",
            "RNR retry counter exceeded",
            "the peer was never ready to receive (no receive posted in time): it stalled, hung "
            "or died",
            "check the peer rank (stuck, out of memory, killed); " + _SAME_SOFTWARE,
        ),
        WcStatus(14, "IBV_WC_LOC_RDD_VIOL_ERR", "local RDD violation error", _RD_ONLY, _RD_FIX),
        WcStatus(15, "IBV_WC_REM_INV_RD_REQ_ERR", "remote invalid RD request", _RD_ONLY, _RD_FIX),
        WcStatus(
            16,
            "IBV_WC_REM_ABORT_ERR",
            "aborted error",
            "the peer aborted the operation (its queue pair failed)",
            _PEER_FIRST,
        ),
        WcStatus(17, "IBV_WC_INV_EECN_ERR", "invalid EE context number", _RD_ONLY, _RD_FIX),
        WcStatus(18, "IBV_WC_INV_EEC_STATE_ERR", "invalid EE context state", _RD_ONLY, _RD_FIX),
        WcStatus(
            19,
            "IBV_WC_FATAL_ERR",
            "fatal error",
            "the HCA hit a catastrophic error and stopped",
            "look for mlx5 health / syndrome messages in the node's kernel log; the device "
            "needs a reset (the node agent marks it fatal); move the job off the node",
        ),
        WcStatus(
            20,
            "IBV_WC_RESP_TIMEOUT_ERR",
            "response timeout error",
            "the peer's response did not arrive in time",
            "check both links, the fabric between them and the peer process",
        ),
        WcStatus(
            21,
            "IBV_WC_GENERAL_ERR",
            "general error",
            "a vendor-specific failure; the vendor error (syndrome) says which",
            "look up the vendor error in the HCA's documentation; check firmware and the "
            "node's kernel log",
        ),
        WcStatus(
            22,
            "IBV_WC_TM_ERR",
            "TM error",
            "a tag-matching offload error (NCCL and perftest use no tag matching)",
            _RD_FIX,
        ),
        WcStatus(
            23,
            "IBV_WC_TM_RNDV_INCOMPLETE",
            "TM software rendezvous",
            "a tag-matching rendezvous left to software (not used by NCCL or perftest)",
            _RD_FIX,
        ),
    )
}

_COMPLETION = re.compile(
    r"Got completion (?:from peer \S+ )?with (?:error |status=(?:[A-Z_]+\()?)(\d{1,3})\b"
    r"|Failed status[- ](?:[^(:]*\()?(\d{1,3})\)?:"
    r"|completion with error (\d{1,3})\b",
    re.I,
)


def completion_status(text: str) -> int | None:
    """The work-completion status a NCCL or perftest error line reports, or None."""
    m = _COMPLETION.search(text)
    if not m:
        return None
    return int(next(g for g in m.groups() if g is not None))


def completion_finding(code: int) -> Finding:
    """`completion-error-N`: the status's meaning, cause and fix (unknown numbers say so)."""
    known = WC_STATUSES.get(code)
    if known is None:
        return Finding(
            f"completion-error-{code}",
            Status.FAIL,
            f"work completion status {code}, which libibverbs does not define",
            "check the verbs library and driver versions match (rdma-core in the image, "
            "driver on the node)",
        )
    return Finding(
        f"completion-error-{code}",
        Status.FAIL,
        f"work completion status {code} ({known.symbol}, {known.text}): {known.cause}",
        known.fix,
    )


@dataclass(frozen=True, slots=True)
class KnownFailure:
    """A known failure: how to recognise it, what it means, the one-line fix."""

    code: str
    pattern: re.Pattern[str]
    status: Status
    meaning: str
    fix: str

    @property
    def finding(self) -> Finding:
        return Finding(self.code, self.status, self.meaning, self.fix)


_GID_FIX = (
    "set NCCL_IB_GID_INDEX to the RoCE v2 IPv4 index `rdmaplane doctor` reports on every "
    "node (or -1 with NCCL >= 2.21)"
)

# Messages NCCL prints (INFO or WARN), each wording of every release that printed it.
NCCL_RULES: tuple[KnownFailure, ...] = (
    KnownFailure(
        "no-rdma-device",
        re.compile(r"NET/IB\s*:\s*No device found"),
        Status.FAIL,
        "NCCL found no usable RDMA device in this container",
        "request rdmaplane.io/hca for the pod (mounts /dev/infiniband) and make NCCL_IB_HCA "
        "name devices that exist (`rdmaplane doctor` checks both)",
    ),
    KnownFailure(
        "libibverbs-missing",
        re.compile(r"Failed to open libibverbs"),
        Status.FAIL,
        "NCCL could not load libibverbs, so it cannot use RDMA at all",
        "install rdma-core's libibverbs1 and ibverbs-providers (libmlx5) in the image",
    ),
    KnownFailure(
        "ib-disabled",
        re.compile(r"NCCL_IB_DISABLE set by environment to 1\b"),
        Status.FAIL,
        "NCCL_IB_DISABLE=1 forces TCP sockets",
        "unset NCCL_IB_DISABLE",
    ),
    KnownFailure(
        "socket-fallback",
        re.compile(r"Using network Socket\b|via NET/Socket/"),
        Status.FAIL,
        "NCCL fell back to TCP sockets between nodes",
        "give the pod an RDMA device (rdmaplane.io/hca) and run `rdmaplane doctor` in it; "
        "NCCL falls back when it finds no ACTIVE HCA",
    ),
    KnownFailure(
        "no-oob-interface",
        re.compile(r"NET/IB\s*:\s*No IP interface found"),
        Status.FAIL,
        "NCCL found no IP interface for its out-of-band connection, so it cannot use IB",
        "set NCCL_SOCKET_IFNAME to an interface with an address (`ip -br addr` in the pod)",
    ),
    KnownFailure(
        "modify-qp-timeout",
        re.compile(r"ibv_modify_qp failed with (?!.*retrying)(?:error )?(?:110 )?Connection timed"),
        Status.FAIL,
        "queue pairs could not connect: the GID index is link-local, RoCE v1, or not the "
        "same valid entry on both nodes",
        _GID_FIX,
    ),
    KnownFailure(
        "connect-failed",
        re.compile(
            r"(?:Connect to \S+ failed|socketStartConnect: (?:exceeded retries|Connect to)|"
            r"ncclIbConnect|connect to (?:remote )?GID|[Rr]emote GID \S+ (?:unreachable|failed)|"
            r"Connection (?:refused|reset by peer)|No route to host|Network is unreachable)"
        ),
        Status.FAIL,
        "a connection between ranks failed (the peer's address or GID could not be reached): "
        "no traffic crossed nodes",
        "check that both pods got RDMA devices and the same valid RoCE v2 GID index "
        "(`rdmaplane gid audit`), that NCCL_SOCKET_IFNAME names a routable interface, and that "
        "the peer was still running",
    ),
    KnownFailure(
        "modify-qp-einval",
        re.compile(r"ibv_modify_qp failed with (?!.*retrying)(?:error )?(?:22 )?Invalid argument"),
        Status.FAIL,
        "a queue pair was refused its settings: the GID index is empty or invalid on that HCA "
        "(or the MTU / traffic class is out of range)",
        _GID_FIX + "; unset NCCL_IB_TC / NCCL_IB_SL overrides to test",
    ),
    KnownFailure(
        "gid-einval",
        re.compile(r"read failed in ncclIbRoceGetVersionNum"),
        Status.FAIL,
        "NCCL < 2.26 read an empty GID table entry (EINVAL) while choosing a GID",
        "set NCCL_IB_GID_INDEX explicitly to a valid RoCE v2 index, or upgrade NCCL to >= 2.26",
    ),
    KnownFailure(
        "memlock",
        re.compile(r"ibv_reg_(?:dmabuf_)?mr(?:_iova2)? failed with error Cannot allocate memory"),
        Status.FAIL,
        "memory registration failed for lack of locked memory",
        "give the container IPC_LOCK (or memlock unlimited); `rdmaplane doctor` checks it",
    ),
    KnownFailure(
        "gpu-memory-registration",
        re.compile(
            r"ibv_reg_(?:dmabuf_)?mr(?:_iova2)? failed with error (?:Bad address|"
            r"Operation not supported|Invalid argument)"
        ),
        Status.FAIL,
        "the HCA could not register GPU memory: GPUDirect RDMA is not available "
        "(nvidia_peermem not loaded, or DMA-BUF unsupported by driver or kernel)",
        "load nvidia_peermem on the node or use DMA-BUF (open kernel module, NCCL >= 2.19); "
        "NCCL_NET_GDR_LEVEL=LOC works around it at a bandwidth cost",
    ),
    KnownFailure(
        "memory-registration",
        re.compile(r"Call to ibv_reg_(?:dmabuf_)?mr(?:_iova2)? failed\s*$"),
        Status.FAIL,
        "memory registration failed (this NCCL does not say why: locked memory or GPUDirect RDMA)",
        "check memlock / IPC_LOCK and nvidia_peermem with `rdmaplane doctor`",
    ),
    KnownFailure(
        "dev-shm",
        re.compile(
            r"Error while (?:creating|attaching to) shared memory segment"
            r"|failed to extend \S+ to \d+ bytes|Could not map /dev/shm"
        ),
        Status.FAIL,
        "NCCL could not create its shared-memory segment: /dev/shm is too small (Docker's "
        "default is 64 MiB)",
        "mount an emptyDir {medium: Memory, sizeLimit: 16Gi} at /dev/shm",
    ),
    KnownFailure(
        "port-error",
        re.compile(r"[Gg]ot (?:non-fatal )?async (?:error )?event\s*: ?port error"),
        Status.FAIL,
        "a port went down during the run",
        "check the cable and switch port (`ibstat`, link_downed counter); the node agent "
        "reports the port and can evict the job so it restarts elsewhere",
    ),
    KnownFailure(
        "hca-fatal",
        re.compile(r"async fatal event|async event\s*: ?local catastrophic error"),
        Status.FAIL,
        "the HCA reported a fatal (catastrophic) error",
        "look for mlx5 health messages in the node's kernel log; the device needs a reset; "
        "move the job off the node",
    ),
    KnownFailure(
        "gid-changed",
        re.compile(r"GID table change"),
        Status.WARN,
        "the GID table changed during the run (an address was added or removed): a GID "
        "index chosen at start may now point elsewhere",
        "keep RoCE interface addresses stable while jobs run; pin NCCL_IB_GID_INDEX",
    ),
    KnownFailure(
        "mixed-link-layers",
        re.compile(
            r"(?:merge|connect) incompatible devices|device is incompatible with the "
            r"local|merge multiple devices together with different link_layer"
        ),
        Status.FAIL,
        "NCCL was given InfiniBand and RoCE devices together and cannot use them as one",
        "list HCAs of one link type in NCCL_IB_HCA",
    ),
)


def classify(message: str) -> list[Finding]:
    """Every known failure a message shows: the rules' findings and a completion status."""
    found = [r.finding for r in NCCL_RULES if r.pattern.search(message)]
    code = completion_status(message)
    if code is not None:
        found.append(completion_finding(code))
    return found
