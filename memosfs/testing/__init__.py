"""The harness: the kill -9 fault runner, the local Redis Cluster, the
offline model, and the one helper that starts and stops a daemon.  Imported
by tests, benchmarks and the CLI only."""
