"""The disk half of HA: everything a backup's copy of the primary's journal
needs that is not a socket or a task, sans-IO and synchronous like the rest
of persistence.

- ``replication``: the link's frames and codec (Hello, Batch, Ack, the
  snapshot's frames), bytes in, frames out, as the protocol codecs are.
- ``handshake``: the link's mutual authentication under the group's secret,
  before any replication frame.
- ``follower``: a backup's store: it writes the primary's records at the same
  positions, keeps its index caught up, and is promoted into a ``Store``.
- ``catchup``: what the primary decides for a backup that was away (batches
  from an LSN or a snapshot of the folder), and the snapshot's receiving end.
- ``epochs``: the epoch history that fences an old primary and tells whether
  two journals diverged.

Its Trio half is gateway/ha/: the link that carries these frames over a
socket, the primary's sender and the backup's loop that drives a
:class:`~persistence.replica.follower.Follower` (writes in a worker thread).
Nothing here imports trio or the gateway (tests/test_layering.py)."""
