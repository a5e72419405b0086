"""High availability: a primary and its backups, coordinated through ZooKeeper.

`election` holds the pure decisions (who may lead, which epoch is current);
`coordinator` talks to ZooKeeper through kazoo.  Nothing here is imported by
a broker that has no ``[ha]`` configuration.
"""
