"""High availability: replication between a primary and its backups, and its coordination."""
