"""The authentication hook every protocol's CONNECT goes through.

Users and hashed passwords arrive with the security issue; until then the
broker admits anyone, as a fresh ActiveMQ does.
"""

from __future__ import annotations

from typing import Protocol


class Authenticator(Protocol):
    def __call__(self, login: str | None, passcode: str | None) -> bool: ...


def allow_anonymous(login: str | None, passcode: str | None) -> bool:
    return True
