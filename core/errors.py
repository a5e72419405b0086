"""Errors the core raises; each carries the reason a client should be told."""

from __future__ import annotations


class CoreError(Exception):
    """A request the broker refuses.  ``reason`` is safe to show the client."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class InvalidDestination(CoreError):
    pass


class NotAuthorized(CoreError):
    pass


class UnknownSubscription(CoreError):
    pass


class DuplicateSubscription(CoreError):
    pass


class UnknownMessage(CoreError):
    pass


class UnknownTransaction(CoreError):
    pass


class TransactionExists(CoreError):
    pass


class LimitExceeded(CoreError):
    pass


class InvalidRequest(CoreError):
    """A request that is well-formed but cannot be honoured as asked."""


class UnknownDestination(CoreError):
    pass


class QueueNotEmpty(CoreError):
    """A delete that would drop stored messages, not asked to (``depth`` of them)."""

    def __init__(self, reason: str, depth: int) -> None:
        super().__init__(reason)
        self.depth = depth
