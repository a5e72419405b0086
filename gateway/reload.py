"""Reloading the configuration without a restart (SIGHUP, as mosquitto does,
or ``POST /api/v1/reload``): the file is read again, with the flags and the
environment over it as at start, and what may change while running is
applied to the operations that follow: logins (users, groups, anonymous
access, lockout), the authorization map, the admin users, and the
per-destination policies.  Everything else (ports, the data folder, the
store, limits...) takes effect at the next start: a reload names those keys
and leaves the running values.  A file that does not load is refused with
its reason (which names the key) and the running configuration stays whole.

What a change means for the broker is :class:`Target`'s (gateway/app.py):
this module decides what changed, sans sockets and tasks."""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Callable
from typing import Any, Protocol

from gateway.admin.api import load_users
from gateway.config import Config, ConfigError

# The keys applied while running; every other key that differs needs a restart.
LIVE_SECTIONS = {"auth": None, "admin": ("users", "users_file"), "broker": ("policies",)}


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one reload did: the keys applied, the keys that wait for a
    restart, or why the file was refused (then nothing was applied)."""

    changed: tuple[str, ...] = ()
    restart_needed: tuple[str, ...] = ()
    refused: str | None = None

    def body(self) -> dict[str, Any]:
        return {"changed": list(self.changed), "restart_needed": list(self.restart_needed)}


class Target(Protocol):
    """The running broker's side of a reload (app.Wiring)."""

    def apply(self, config: Config, admins: dict[str, tuple[str, str]]) -> None: ...


def differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two settings objects."""
    if dataclasses.is_dataclass(old) and dataclasses.is_dataclass(new) and type(old) is type(new):
        keys: list[str] = []
        for field in dataclasses.fields(old):
            keys += differences(getattr(old, field.name), getattr(new, field.name), f"{prefix}{field.name}.")
        return keys
    return [] if old == new else [prefix.rstrip(".")]


def live(key: str) -> bool:
    section, _, name = key.partition(".")
    if section not in LIVE_SECTIONS:
        return False
    names = LIVE_SECTIONS[section]
    return names is None or name in names


def _users(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: {k: v for k, v in e.items() if k != "name"} for e in entries}


def _user_changes(what: str, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``what`` +added -removed ~changed, by user name (never a hash)."""
    marks = [f"+{n}" for n in sorted(new.keys() - old.keys())] + [f"-{n}" for n in sorted(old.keys() - new.keys())]
    marks += [f"~{n}" for n in sorted(old.keys() & new.keys()) if old[n] != new[n]]
    return [f"{what} {' '.join(marks)}"] if marks else []


class Reloader:
    """Holds the running configuration; :meth:`reload` reads the file again
    (``reread(running)``, config.load with the start's arguments) and applies
    what may change live to ``target``."""

    def __init__(self, config: Config, admins: dict[str, tuple[str, str]], reread: Callable[[Config], Config] | None,
                 target: Target, log: Any) -> None:
        self.config = config
        self.admins = admins
        self.reread = reread
        self.target = target
        self.log = log

    def reload(self, trigger: str) -> Outcome:
        if self.reread is None:
            reason = "this broker has no configuration to read again (an HA node): restart it to change its configuration"
            self.log.warning("config_reload_failed", trigger=trigger, reason=reason)
            return Outcome(refused=reason)
        try:
            new = self.reread(self.config)
            admins = load_users(new.admin)
        except (ConfigError, ValueError, OSError, tomllib.TOMLDecodeError) as exc:
            reason = f"{exc.filename}: {exc.strerror}" if isinstance(exc, OSError) and exc.filename else str(exc)
            self.log.warning("config_reload_failed", trigger=trigger, reason=reason,
                             detail="the running configuration stays in use")
            return Outcome(refused=reason)
        keys = differences(self.config, new)
        restart = tuple(k for k in keys if not live(k))
        changed = [k for k in keys if live(k) and k not in ("auth.users", "admin.users", "admin.users_file")]
        changed += _user_changes("auth.users", _users(self.config.auth.users), _users(new.auth.users))
        changed += _user_changes("admin users", {n: list(v) for n, v in self.admins.items()},
                                 {n: list(v) for n, v in admins.items()})
        running = dataclasses.replace(
            self.config, auth=new.auth,
            admin=dataclasses.replace(self.config.admin, users=new.admin.users, users_file=new.admin.users_file),
            broker=dataclasses.replace(self.config.broker, policies=new.broker.policies),
        )
        if changed:
            self.target.apply(running, admins)
        self.config, self.admins = running, admins
        self.log.info("config_reloaded", trigger=trigger, changed=changed, restart_needed=list(restart))
        if restart:
            self.log.warning("config_reload_needs_restart", keys=list(restart),
                             detail="these keys take effect at the next start; the running values stay")
        return Outcome(tuple(changed), restart)
