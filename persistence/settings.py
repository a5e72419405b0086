"""The store's settings (the ``[store]`` section of the configuration)."""

from __future__ import annotations

import dataclasses

# always: a receipt waits for fdatasync (group commit); interval: fsync at
# most every sync_interval_ms and receipts do not wait; never: tests only.
SYNC_POLICIES = ("always", "interval", "never")


@dataclasses.dataclass(frozen=True)
class StoreSettings:
    sync: str = "always"
    sync_interval_ms: int = 100
    segment_bytes: int = 32 * 1024 * 1024
    # Topic archives: segment size (retention drops whole segments).
    archive_segment_bytes: int = 16 * 1024 * 1024
    # How often the maintenance task checkpoints, collects and compacts (and
    # the free space of the data folder is looked at).
    maintenance_interval_s: float = 1.0
    # The disk alarm (RabbitMQ's disk_free_limit): below this many free bytes
    # on the data folder's filesystem persistent producers are held (or
    # refused, with send_fail_if_no_space) until space comes back; 0 = off.
    min_free_bytes: int = 50 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.sync not in SYNC_POLICIES:
            raise ValueError(f"store.sync must be one of {', '.join(SYNC_POLICIES)}, not {self.sync!r}")
        if self.min_free_bytes < 0:
            raise ValueError(f"store.min_free_bytes must not be negative, not {self.min_free_bytes}")
        if self.archive_segment_bytes <= 0:
            raise ValueError(f"store.archive_segment_bytes must be positive, not {self.archive_segment_bytes}")
