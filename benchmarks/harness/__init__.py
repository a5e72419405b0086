"""What every benchmark runner shares: the one broker launcher (broker.py), the one
report printer (report.py), and the other processes runners start: the HA
cluster and its link proxy, the peer brokers (stdlib only)."""
