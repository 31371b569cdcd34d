"""The harness, imported by tests, benchmarks and the CLI only:

    daemon.py       the one helper that starts, watches (is_mounted, read_stats)
                    and stops a daemon, kill -9 included
    errnos.py       errno_of
    faults.py       the kill -9 fault runner (writer, checker, cycles)
    localcluster.py a local Redis Cluster
    models.py       the offline model
    prefetch_sim.py the prefetch workloads and the in-process simulator
    policy_sim.py   the eviction trace loader and the evict_batch measurement
"""
