"""The ``gateway`` command line."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Mapping
from functools import partial

from gateway import __version__, app, config, logs

DESCRIPTION = """\
gateway: a STOMP and MQTT message broker.

Settings come from the defaults, then the TOML file given with --config, then
the flags below (a flag always wins).  Ports default to ActiveMQ's: STOMP
61613, MQTT 1883, admin HTTP 8161.
"""


def parser() -> argparse.ArgumentParser:
    """The command line's grammar: public so that what a deployment passes
    (a container's args) can be checked against it without running it."""
    top = argparse.ArgumentParser(prog="gateway", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--version", action="version", version=f"gateway {__version__}")
    commands = top.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the broker", description="Run the broker until SIGINT or SIGTERM.")
    serve.add_argument("--config", metavar="FILE", help="TOML configuration file")
    serve.add_argument("--bind", metavar="ADDRESS", help="address every listener binds (default 127.0.0.1; 0.0.0.0 for all)")
    serve.add_argument("--stomp-port", type=int, metavar="PORT", help="STOMP listener port (default 61613; 0 picks a free one)")
    serve.add_argument("--mqtt-port", type=int, metavar="PORT", help="MQTT listener port (default 1883; 0 picks a free one)")
    serve.add_argument("--admin-port", type=int, metavar="PORT", help="admin HTTP port (default 8161; 0 picks a free one)")
    serve.add_argument("--data-dir", metavar="DIR", help="data folder for the store (default ./data)")
    serve.add_argument("--log-format", choices=config.LOG_FORMATS, help="console (default) or json lines")
    serve.add_argument("--log-level", choices=config.LOG_LEVELS, help="default info")
    passwd = commands.add_parser(
        "passwd", help="hash a password for an [admin] users (or, with --client, [auth] users) entry",
        description="Read a password (prompted, or one line on standard input) and print its salted hash "
                    "as a TOML users entry.",
    )
    passwd.add_argument("--name", default="admin", help="the user name to print the TOML entry for")
    passwd.add_argument("--role", choices=("read", "browse", "write"), default="write",
                        help="an admin user's role: read (metrics and state), browse (and message contents), "
                             "write (and changes); default write")
    passwd.add_argument("--client", action="store_true", help="a STOMP/MQTT client user ([auth] users): no role")
    passwd.add_argument("--group", action="append", default=[], metavar="GROUP",
                        help="with --client: a group for the [[auth.acl]] grants (repeat for more)")
    store = commands.add_parser("store", help="inspect or compact a data folder offline (broker stopped)")
    actions = store.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser("check", help="verify every record and print what the store holds")
    check.add_argument("data_dir", metavar="DATA_DIR")
    compact = actions.add_parser("compact", help="rewrite segments so only live records remain")
    compact.add_argument("data_dir", metavar="DATA_DIR")
    return top


def main(argv: list[str] | None = None) -> int:
    grammar = parser()
    args = grammar.parse_args(argv)
    if args.command == "passwd":
        if args.group and not args.client:
            grammar.error("--group is for client users (--client)")
        return _passwd(args.name, None if args.client else args.role, args.group)
    if args.command == "store":
        from gateway import storetool

        return storetool.main(args.action, args.data_dir)
    if args.command != "serve":
        grammar.print_help()
        return 2
    overrides = {
        "bind": args.bind,
        "stomp_port": args.stomp_port,
        "mqtt_port": args.mqtt_port,
        "admin_port": args.admin_port,
        "data_dir": args.data_dir,
        "log_format": args.log_format,
        "log_level": args.log_level,
    }
    try:
        cfg = config.load(args.config, overrides, os.environ)
    except config.ConfigError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    log = logs.configure(cfg.log_format, cfg.log_level)
    from gateway import startup

    refused = startup.check_users(cfg, log)
    if refused is not None:
        print(f"gateway: {refused}", file=sys.stderr)
        return 2
    startup.check_secret_files(cfg, os.environ, log)
    failures: list[BaseException] = []
    code = 0
    # SIGHUP reloads the configuration once the broker runs (tasks.reload_on_signal;
    # an HA node says it does not); until then (recovery) it is ignored rather
    # than the end of the process.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    reread = partial(_reread, args.config, overrides, os.environ)
    try:
        if cfg.ha is None:
            app.run(cfg, log, reread)
        else:
            from gateway.ha import process  # kazoo and the HA package: only for an [ha] node

            code = process.run(cfg, log)
    except* OSError as group:
        # Trio's nurseries wrap it; a port in use or an unreadable data folder
        # is an operator's mistake, worth one clear line rather than a traceback.
        failures = _leaves(group)
    for exc in failures:
        log.error("startup_failed", reason=startup.explain(exc, cfg))
    return 1 if failures else code


def _reread(path: str | None, overrides: dict[str, object], environ: Mapping[str, str], running: config.Config) -> config.Config:
    """The configuration as at start (file, flags, environment), read again for a reload."""
    return config.load(path, overrides, environ, previous=running)


def _passwd(name: str, role: str | None, groups: list[str]) -> int:
    """One users entry: an admin's with its ``role``, or (None) a client's with its ``groups``."""
    import getpass
    import json

    from gateway.auth import hash_password

    password = getpass.getpass("password: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
    if not password:
        print("gateway: empty password", file=sys.stderr)
        return 2
    # JSON strings are TOML basic strings: a name with a quote stays one key.
    entry = f"name = {json.dumps(name)}, password_hash = \"{hash_password(password)}\""
    if role is not None:
        entry += f", role = \"{role}\""
    elif groups:
        entry += f", groups = [{', '.join(json.dumps(g) for g in groups)}]"
    print(f"{{ {entry} }}")
    return 0


def _leaves(group: BaseException) -> list[BaseException]:
    if isinstance(group, BaseExceptionGroup):
        return [leaf for exc in group.exceptions for leaf in _leaves(exc)]
    return [group]


if __name__ == "__main__":
    sys.exit(main())
