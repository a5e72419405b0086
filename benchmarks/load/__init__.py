"""The client side of the benchmarks: load generators on raw sockets (STOMP wire
helpers, run.py's worker processes, the persistence and failover clients)
(stdlib only)."""
