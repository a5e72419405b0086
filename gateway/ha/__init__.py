"""High availability: a primary and its backups.

`election` holds the pure decisions (who may lead, which epoch is current)
and `node` the role table; `coordinator` talks to ZooKeeper through kazoo;
`runtime` runs one node (`process` node after node).  The stream:
`replicator` (its primary end; `primary_role` puts it in the broker as
gateway/app.py's ``Replication``), `backup` (its backup end) and `link` carry
the journal's batches between nodes; the disk half is persistence's.  Nothing
here is imported by a broker that has no ``[ha]`` configuration.
"""
