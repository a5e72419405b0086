"""What ``gateway serve`` checks before it starts a broker, and the one line an
operator gets when start-up fails: which thing, why, and what to do."""

from __future__ import annotations

import errno
import os
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.admin.api import USERS_FILE_ENV, load_users
from gateway.auth import is_loopback, usable_hash
from gateway.config import ADMIN_USER_ENVIRONMENT, CLIENT_USER_ENVIRONMENT, USERS_FILE_ENVIRONMENT, Config
from gateway.transports.server import ListenError
from persistence import files
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


def announce_access(config: Config, log: Any) -> None:
    """Say who may connect without a login, in one line, when it matters: a
    broker bound beyond loopback with no users refuses anonymous clients from
    other machines (and says how to admit them or add users); one opened on
    purpose (``anonymous = "true"``) says it is open to anyone who reaches
    it.  At start and after each reload (the users may have changed)."""
    auth = config.auth
    local = config.bind == "localhost" or is_loopback(config.bind)
    if auth.anonymous == "true" and not local:
        log.warning("broker_open_to_network", bind=config.bind, users=len(auth.users),
                    detail="[auth] anonymous = \"true\": ANYONE who can reach these ports may connect without a "
                           "login and read and write every destination the authorization map leaves open")
    elif auth.anonymous == "true" and auth.users:
        log.warning("anonymous_access_enabled", users=len(auth.users))
    elif auth.anonymous == "auto" and not auth.users and not local:
        name, password = CLIENT_USER_ENVIRONMENT
        log.warning("remote_anonymous_refused", bind=config.bind,
                    detail=f"no users: anonymous clients from other machines are refused (this machine's are "
                           f"admitted); add users ({name} and {password}, [auth] users_file or "
                           f"{USERS_FILE_ENVIRONMENT}, `gateway passwd --client`), or admit anyone with "
                           "[auth] anonymous = \"true\"")
    elif auth.anonymous == "false" and not auth.users:
        name, password = CLIENT_USER_ENVIRONMENT
        log.warning("no_client_can_connect", detail=f"no users and [auth] anonymous = \"false\": every client is "
                                                    f"refused; add users ({name} and {password}, [auth] users_file "
                                                    f"or {USERS_FILE_ENVIRONMENT}, `gateway passwd --client`)")


def check_secret_files(config: Config, environ: Mapping[str, str], log: Any) -> None:
    """Warn, once per file, about a secret file other users can read (the
    users files, the TLS key, the cluster secret), as Mosquitto does.  World-readable always
    counts; group-readable only when the broker owns the file, as it then
    needs no group to read it (a Kubernetes Secret is root's, readable by
    the pod's fsGroup: that group is how the broker reads it)."""
    named = {
        config.auth.users_file or environ.get(USERS_FILE_ENVIRONMENT, ""): "users file",
        config.admin.users_file or environ.get(USERS_FILE_ENV, ""): "admin users file",
        config.tls.key: "TLS key",
        config.ha.cluster_secret_file if config.ha is not None else "": "cluster secret file",
    }
    for path, what in named.items():
        if not path:
            continue
        try:
            info = os.stat(path)
        except OSError:
            continue  # loading it says what is wrong
        mode, owned = stat.S_IMODE(info.st_mode), info.st_uid == os.geteuid()
        if mode & stat.S_IROTH or (mode & stat.S_IRGRP and owned):
            log.warning("secret_file_readable", file=path, what=what, mode=f"{mode:04o}",
                        detail=f"other users of this machine can read it: chmod {'go' if owned else 'o'}-rwx {path}")


def prepare_data_dir(config: Config, log: Any) -> None:
    """Make the data folder owner-only (0700, its files 0600; persistence
    creates them so); one left open by an older version or a shell's mkdir
    is tightened, since only this user's broker and ``gateway store`` read
    it, and said so once."""
    folder = Path(config.data_dir)
    files.make_dirs(folder)
    before, changed = files.tighten(folder)
    if before is not None or changed:
        log.warning("data_folder_tightened", folder=str(folder), mode=f"{before:04o}" if before is not None else None,
                    files=changed, detail="other users could read stored messages; the folder is now 0700 and its files 0600")


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
