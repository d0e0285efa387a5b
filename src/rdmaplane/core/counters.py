"""The port counters rdmaplane knows, one row each: the one table that config validation, the
health rules' defaults, the Prometheus metrics, the sample nodes' counter files, the Grafana
dashboard and the docs' counter table come from. Pure data.

`counters/` (under `ports/N/`) holds the InfiniBand PMA counters, which every RDMA device with a
PMA has (the names come from the kernel's `drivers/infiniband/core/sysfs.c`); `hw_counters/`
(per port, or device-wide on single-port HCAs) holds the driver's own: these are mlx5's
(`drivers/infiniband/hw/mlx5/counters.c`), the NICs rdmaplane is built for. A health threshold
may name any of them; other names are refused in the config, so a typo cannot leave a threshold
that never fires.
"""

from __future__ import annotations

from dataclasses import dataclass

from rdmaplane.core.porthealth import FaultClass

PMA = "counters"
HW = "hw_counters"


@dataclass(frozen=True, slots=True)
class PortCounter:
    """One counter file. `metric`: `rdmaplane_port_<metric>_total`, None when not exported;
    `scale`: what one count is worth in the metric's unit (the PMA data counters count 4-octet
    words); `threshold`: the increments within the health window tolerated by default, None when
    not watched by default; `cls`: what a rise over that threshold is by default; `hourly` and
    `hourly_cls`: the same for the increments within an hour (a rate: a steady trickle under
    the window's limit); `panel`: the Grafana dashboard panel that draws it, None when none
    does."""

    name: str
    directory: str  # PMA (`ports/N/counters/`) or HW (`hw_counters/`)
    help: str
    metric: str | None = None
    scale: int = 1
    threshold: int | None = None
    cls: FaultClass | None = None
    hourly: int | None = None
    hourly_cls: FaultClass | None = None
    panel: str | None = None


_P, _H = PMA, HW
_F, _D = FaultClass.FATAL, FaultClass.DEGRADED
PORT_COUNTERS: tuple[PortCounter, ...] = (
    # PMA: errors
    PortCounter(
        "link_downed",
        _P,
        "Times the link training failed or the link went down",
        "link_downed",
        threshold=0,  # one is already a flap
        cls=_F,
        panel="Link errors",
    ),
    PortCounter(
        "symbol_error",
        _P,
        "Minor link errors detected on a physical lane",
        "symbol_errors",
        threshold=100,
        cls=_D,
        hourly=120,  # the IBTA bit error rate limit, as NVSentinel applies it: more is fatal
        hourly_cls=_F,
        panel="Link errors",
    ),
    PortCounter(
        "link_error_recovery",
        _P,
        "Successful link error recoveries",
        "link_error_recoveries",
        hourly=300,  # 5 a minute, every minute (NVSentinel's rate for link retraining)
        hourly_cls=_D,
        panel="Link errors",
    ),
    PortCounter(
        "port_rcv_errors",
        _P,
        "Received packets with errors",
        "receive_errors",
        threshold=100,
        cls=_D,
        hourly=600,
        hourly_cls=_D,
        panel="Receive errors and discards",
    ),
    PortCounter(
        "port_xmit_discards",
        _P,
        "Outbound packets discarded",
        "transmit_discards",
        panel="Receive errors and discards",
    ),
    PortCounter(
        "port_rcv_remote_physical_errors",
        _P,
        "Received packets marked with EBP",
        "receive_remote_physical_errors",
    ),
    PortCounter(
        "local_link_integrity_errors",
        _P,
        "Times the local physical error threshold was exceeded",
        "local_link_integrity_errors",
    ),
    PortCounter(
        "excessive_buffer_overrun_errors",
        _P,
        "Times consecutive flow-control overruns exceeded the threshold",
        "excessive_buffer_overrun_errors",
    ),
    PortCounter(
        "port_rcv_switch_relay_errors", _P, "Received packets the switch relay could not forward"
    ),
    PortCounter(
        "port_xmit_constraint_errors", _P, "Outbound packets held back by partition or filtering"
    ),
    PortCounter(
        "port_rcv_constraint_errors", _P, "Inbound packets dropped by partition or filtering"
    ),
    PortCounter("VL15_dropped", _P, "Subnet management packets dropped for lack of buffers"),
    # PMA: traffic
    PortCounter(
        "port_xmit_data",
        _P,
        "Bytes transmitted (PMA port_xmit_data x 4)",
        "transmit_bytes",
        scale=4,
    ),
    PortCounter(
        "port_rcv_data", _P, "Bytes received (PMA port_rcv_data x 4)", "receive_bytes", scale=4
    ),
    PortCounter(
        "port_xmit_packets", _P, "Packets transmitted", "transmit_packets", panel="Packets"
    ),
    PortCounter("port_rcv_packets", _P, "Packets received", "receive_packets", panel="Packets"),
    PortCounter(
        "port_xmit_wait", _P, "Ticks with data to send but no credits", "transmit_wait_ticks"
    ),
    PortCounter("unicast_xmit_packets", _P, "Unicast packets transmitted"),
    PortCounter("unicast_rcv_packets", _P, "Unicast packets received"),
    PortCounter("multicast_xmit_packets", _P, "Multicast packets transmitted"),
    PortCounter("multicast_rcv_packets", _P, "Multicast packets received"),
    # mlx5: transport (queue counters)
    PortCounter(
        "local_ack_timeout_err",
        _H,
        "Local ACK timeouts (QP retries)",
        "local_ack_timeout_errors",
        threshold=100,
        cls=_D,
        hourly=600,
        hourly_cls=_D,
        panel="Transport errors (mlx5 hw_counters)",
    ),
    PortCounter(
        "out_of_sequence",
        _H,
        "Out-of-sequence packets received",
        "out_of_sequence_packets",
        hourly=600,
        hourly_cls=_D,
        panel="Transport errors (mlx5 hw_counters)",
    ),
    PortCounter(
        "packet_seq_err",
        _H,
        "NAKs for packet sequence errors received",
        "packet_sequence_errors",
        hourly=600,
        hourly_cls=_D,
        panel="Transport errors (mlx5 hw_counters)",
    ),
    PortCounter(
        "rnr_nak_retry_err",
        _H,
        "RNR NAK retries exhausted",
        "rnr_nak_retry_errors",
        hourly=60,
        hourly_cls=_D,
        panel="Transport errors (mlx5 hw_counters)",
    ),
    PortCounter("out_of_buffer", _H, "Drops for lack of receive WQEs", "out_of_buffer_drops"),
    PortCounter("rx_write_requests", _H, "RDMA write requests received", "receive_write_requests"),
    PortCounter("rx_read_requests", _H, "RDMA read requests received", "receive_read_requests"),
    PortCounter(
        "rx_atomic_requests", _H, "RDMA atomic requests received", "receive_atomic_requests"
    ),
    PortCounter("duplicate_request", _H, "Duplicate requests received", "duplicate_requests"),
    PortCounter(
        "implied_nak_seq_err", _H, "Implied NAK sequence errors", "implied_nak_sequence_errors"
    ),
    PortCounter("rx_dct_connect", _H, "DCT connect requests received"),
    # mlx5: extended error counters
    PortCounter("resp_local_length_error", _H, "Responder: messages longer than the buffer"),
    PortCounter("resp_cqe_error", _H, "Responder: completions with an error"),
    PortCounter("req_cqe_error", _H, "Requester: completions with an error"),
    PortCounter("req_remote_invalid_request", _H, "Requester: remote invalid request NAKs"),
    PortCounter("req_remote_access_errors", _H, "Requester: remote access error NAKs"),
    PortCounter("resp_remote_access_errors", _H, "Responder: remote access errors"),
    PortCounter("resp_cqe_flush_error", _H, "Responder: completions flushed with an error"),
    PortCounter("req_cqe_flush_error", _H, "Requester: completions flushed with an error"),
    PortCounter("req_transport_retries_exceeded", _H, "Requests out of transport retries"),
    PortCounter("req_rnr_retries_exceeded", _H, "Requests out of RNR retries"),
    # mlx5: RoCE acceleration
    PortCounter("roce_adp_retrans", _H, "Adaptive retransmissions"),
    PortCounter("roce_adp_retrans_to", _H, "Adaptive retransmission timeouts"),
    PortCounter("roce_slow_restart", _H, "Slow restarts"),
    PortCounter("roce_slow_restart_cnps", _H, "CNPs sent by slow restart"),
    PortCounter("roce_slow_restart_trans", _H, "Entries into the slow restart state"),
    # mlx5: congestion control
    PortCounter(
        "np_cnp_sent",
        _H,
        "Congestion notification packets sent (notification point)",
        "cnp_sent",
        panel="CNPs",
    ),
    PortCounter(
        "rp_cnp_handled", _H, "CNPs handled by the reaction point", "cnp_handled", panel="CNPs"
    ),
    PortCounter("rp_cnp_ignored", _H, "CNPs ignored by the reaction point", "cnp_ignored"),
    PortCounter(
        "np_ecn_marked_roce_packets",
        _H,
        "RoCE packets received with ECN marking",
        "ecn_marked_roce_packets",
        panel="ECN-marked RoCE packets",
    ),
    PortCounter("rx_icrc_encapsulated", _H, "RoCE packets received with an ICRC error"),
)

BY_NAME = {c.name: c for c in PORT_COUNTERS}
KNOWN_COUNTERS = frozenset(BY_NAME)

# The health rules' defaults (`health.thresholds`, `fault.fatalThresholds`): within the window.
DEFAULT_THRESHOLDS = {c.name: c.threshold for c in PORT_COUNTERS if c.threshold is not None}
DEFAULT_FATAL_THRESHOLDS = {
    c.name: c.threshold for c in PORT_COUNTERS if c.threshold is not None and c.cls is _F
}
# Per hour (`health.hourlyThresholds`, `fault.hourlyFatalThresholds`).
DEFAULT_HOURLY_THRESHOLDS = {c.name: c.hourly for c in PORT_COUNTERS if c.hourly is not None}
DEFAULT_HOURLY_FATAL_THRESHOLDS = {
    c.name: c.hourly for c in PORT_COUNTERS if c.hourly is not None and c.hourly_cls is _F
}
