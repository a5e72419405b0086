"""High availability: a primary and its backups.

`election` holds the pure decisions (who may lead, which epoch is current);
`coordinator` talks to ZooKeeper through kazoo; `replicator` (the primary's
side), `backup` and `link` carry the journal's batches between nodes.  Nothing
here is imported by a broker that has no ``[ha]`` configuration.
"""
