"""The error and traffic counters the kernel exposes per RDMA port, by file name.

Pure data. `ports/N/counters/` holds the InfiniBand PMA counters, which every RDMA device
with a PMA has (the names come from the kernel's `drivers/infiniband/core/sysfs.c`);
`ports/N/hw_counters/` (and, on single-port HCAs, the device-wide `hw_counters/`) holds the
driver's own: these are mlx5's (`drivers/infiniband/hw/mlx5/counters.c`), the NICs rdmaplane is
built for. The health monitor can watch any of them; other names are refused in the config, so a
typo cannot leave a threshold that never fires.
"""

from __future__ import annotations

PMA_COUNTERS = frozenset(
    {
        "symbol_error",
        "link_error_recovery",
        "link_downed",
        "port_rcv_errors",
        "port_rcv_remote_physical_errors",
        "port_rcv_switch_relay_errors",
        "port_xmit_discards",
        "port_xmit_constraint_errors",
        "port_rcv_constraint_errors",
        "local_link_integrity_errors",
        "excessive_buffer_overrun_errors",
        "VL15_dropped",
        "port_xmit_data",
        "port_rcv_data",
        "port_xmit_packets",
        "port_rcv_packets",
        "port_xmit_wait",
        "unicast_xmit_packets",
        "unicast_rcv_packets",
        "multicast_xmit_packets",
        "multicast_rcv_packets",
    }
)

MLX5_HW_COUNTERS = frozenset(
    {
        # queue counters
        "rx_write_requests",
        "rx_read_requests",
        "rx_atomic_requests",
        "rx_dct_connect",
        "out_of_buffer",
        "out_of_sequence",
        "duplicate_request",
        "rnr_nak_retry_err",
        "packet_seq_err",
        "implied_nak_seq_err",
        "local_ack_timeout_err",
        # extended error counters
        "resp_local_length_error",
        "resp_cqe_error",
        "req_cqe_error",
        "req_remote_invalid_request",
        "req_remote_access_errors",
        "resp_remote_access_errors",
        "resp_cqe_flush_error",
        "req_cqe_flush_error",
        "req_transport_retries_exceeded",
        "req_rnr_retries_exceeded",
        # RoCE acceleration
        "roce_adp_retrans",
        "roce_adp_retrans_to",
        "roce_slow_restart",
        "roce_slow_restart_cnps",
        "roce_slow_restart_trans",
        # congestion control
        "rp_cnp_ignored",
        "rp_cnp_handled",
        "np_ecn_marked_roce_packets",
        "np_cnp_sent",
        "rx_icrc_encapsulated",
    }
)

KNOWN_COUNTERS = PMA_COUNTERS | MLX5_HW_COUNTERS
