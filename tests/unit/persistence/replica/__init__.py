"""Unit tests of persistence/replica/: the backup's store and the link's sans-IO halves."""
