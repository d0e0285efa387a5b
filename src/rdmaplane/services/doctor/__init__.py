"""`rdmaplane doctor`: prove inside a pod that RDMA is really used, and how close to line rate.

Parsers (`parse_perftest`, `parse_nccl_tests`, `parse_nccl_log`) are pure functions over text;
`checks` reads one node below a root directory; `perf` drives perftest and a TCP stream;
`report` merges per-pod results into one cluster report.
"""
