"""The log-structured store: segmented journal, recovery, index, checkpoint
and compaction.  Imports the standard library only (tests/test_layering.py)."""
