"""Worker processes that share the client ports and each own a shard of the
keys (issue 32, step one of the network of brokers; docs/design/workers.md).

Built so far, and not yet wired into ``gateway serve``: shards.py (pure: which
shard owns a key, and the map) and cpus.py (how many CPUs this process may use)."""
