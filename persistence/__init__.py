"""The log-structured store: segmented journal, recovery, index, checkpoint
and compaction; topic archives; and, in :mod:`persistence.replica`, the disk
half of HA (a backup's copy of the journal and the stream that feeds it).

Imports the standard library and, of ours, only ``core.storage``: the store
port's contract (plain records and a Protocol), itself a stdlib-only leaf.
Never trio, the gateway or the rest of the core (tests/test_layering.py)."""
