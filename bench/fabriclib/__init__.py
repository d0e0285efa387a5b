"""What the fabric benches share (`bench/fabric_*.py`): not a benchmark itself, so `make bench`'s
loop over `bench/*.py` does not run it. Each script puts the repository root on `sys.path` (for
`tests/`) and runs with `bench/` first on it, so this package and `bench/cluster.py` import as
top-level modules.

- `fabric`: the 256-node fabric (16 leaves of 16, 4 leaves per spine, one core), hops;
- `trace`: the jobs, their pods, and the two traces (whole-node jobs and prefill/decode pairs;
  part-node jobs for the rails) with their timing;
- `model`: rdmaplane's stand-in schedulers over the extender's cache, and the per-job tally;
- `rails`: matching rails, every pod admitted by a kubelet harness per node;
- `rig`: the real kube-scheduler on KWOK, one arm at a time (namespace, scheduler, extender);
- `replay`: what a real arm did, replayed through one kubelet harness standing in for many;
- `agents`: the node agents KWOK does not run, writing the NRTs from that replay as pods come
  and go;
- `report`: the columns, rows and legends the scripts print.
"""
