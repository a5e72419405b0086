"""Scenarios a runner delegates to: run.py's queue, topic and latency
(throughput.py) and persistent.py's persistent and restart (persistence.py)."""
