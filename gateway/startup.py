"""What ``gateway serve`` checks before it starts a broker, and the one line an
operator gets when start-up fails: which thing, why, and what to do."""

from __future__ import annotations

import errno
import os
import tomllib
from pathlib import Path
from typing import Any

from gateway.admin.api import load_users
from gateway.auth import usable_hash
from gateway.config import ADMIN_USER_ENVIRONMENT, Config
from gateway.transports.server import ListenError
from persistence.recovery import FolderInUse

PLACEHOLDER_ADVICE = ("it matches no password, so this user cannot log in (a placeholder such as deploy/'s?): "
                      "make a hash with `gateway passwd` and put it in its place")


def check_users(config: Config, log: Any) -> str | None:
    """Load the admin users (config, users file, environment) as the broker
    will; the reason start-up must stop, or None.  A user whose hash admits
    nobody (deploy/admin-users.toml's placeholder) is warned about, once per
    user: the broker would otherwise answer every admin call 401 without a word."""
    try:
        admins = load_users(config.admin)
    except FileNotFoundError as exc:
        return f"admin users file {exc.filename} does not exist: fix [admin] users_file or GATEWAY_ADMIN_USERS_FILE"
    except OSError as exc:
        return f"admin users file {exc.filename}: {exc.strerror}"
    except tomllib.TOMLDecodeError as exc:
        return f"admin users file: {exc}"
    except ValueError as exc:
        return str(exc)
    for name, (hashed, _) in admins.items():
        if not usable_hash(hashed):
            log.warning("admin_user_unusable", user=name, detail=PLACEHOLDER_ADVICE)
    for entry in config.auth.users:
        if not usable_hash(entry["password_hash"]):
            log.warning("user_unusable", user=entry["name"], detail=PLACEHOLDER_ADVICE)
    return None


def no_admin_detail() -> str:
    name, password = ADMIN_USER_ENVIRONMENT
    return (f"no admin users: the admin API answers 403; set {name} and {password} and restart, "
            "or add [admin] users (`gateway passwd`) to the config file and send SIGHUP")


def explain(exc: BaseException, config: Config) -> str:
    """One line for a start-up failure (an OSError out of the broker's start)."""
    if isinstance(exc, ListenError | FolderInUse):
        return str(exc)  # they say which listener or folder, and what to do
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        data_dir = Path(config.data_dir).resolve()
        inside = exc.filename is None or Path(os.fsdecode(exc.filename)).resolve().is_relative_to(data_dir)
        if not inside:
            return f"{exc.strerror or exc}{where}"
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return (f"data folder {config.data_dir}{where}: {exc.strerror}: make it writable by this user "
                    "or choose another with --data-dir")
        if exc.errno == errno.ENOSPC:
            return f"data folder {config.data_dir}{where}: no space left on the device: free some or choose another --data-dir"
        return f"data folder {config.data_dir}{where}: {exc.strerror or exc}: fix it or choose another with --data-dir"
    return str(exc)
