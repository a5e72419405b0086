"""One frozen configuration, read from a TOML file and overridden by flags."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core.broker import BrokerSettings
from gateway.admin.api import AdminSettings
from gateway.auth import AuthSettings, hash_password
from gateway.mqtt.session import MqttSettings
from gateway.stomp.session import StompSettings
from gateway.transports.tls import TlsSettings, link_contexts, server_context
from persistence.settings import StoreSettings

LOG_FORMATS = ("console", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(Exception):
    """The configuration is unusable; the message says where and why."""


# The rule gateway/ha/election.py applies to node ids, repeated here so that
# reading a configuration never imports the HA package.
NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


# The [ha] keys that differ from node to node, read from the environment when
# set (non-empty) so that one file serves the whole group: a Kubernetes pod sets
# them from its own name, while the shared keys stay in the ConfigMap.
HA_ENVIRONMENT = {"node_id": "GATEWAY_HA_NODE_ID", "advertise": "GATEWAY_HA_ADVERTISE"}
# The group's ZooKeeper credentials, "user:password", when [ha]
# zookeeper_auth_file names no file: a file named by the first (a mounted
# Secret, as GATEWAY_USERS_FILE), or the value itself in the second.
ZOOKEEPER_AUTH_FILE_ENVIRONMENT = "GATEWAY_ZOOKEEPER_AUTH_FILE"
ZOOKEEPER_AUTH_ENVIRONMENT = "GATEWAY_ZOOKEEPER_AUTH"
MAX_ZOOKEEPER_AUTH = 1024


# The cluster secret when [ha] cluster_secret_file names no file.
CLUSTER_SECRET_ENVIRONMENT = "GATEWAY_CLUSTER_SECRET"
MIN_SECRET_BYTES = 16


def _cluster_secret(ha: dict[str, Any], environ: Mapping[str, str]) -> bytes:
    """The file's content (trailing whitespace off: a file written with echo),
    else the environment's; b"" when neither is set."""
    if "cluster_secret" in ha:
        raise ConfigError("unknown setting ha.'cluster_secret': put the secret in ha.cluster_secret_file or "
                          f"{CLUSTER_SECRET_ENVIRONMENT}, not in the configuration")
    path = ha.get("cluster_secret_file", "")
    if isinstance(path, str) and path:
        try:
            secret = Path(path).read_bytes().rstrip()
        except OSError as exc:
            raise ConfigError(f"ha.cluster_secret_file {path}: {exc.strerror or exc}") from None
        if not secret:
            raise ConfigError(f"ha.cluster_secret_file {path} is empty")
        return secret
    return environ.get(CLUSTER_SECRET_ENVIRONMENT, "").strip().encode()


def _host_port(name: str, value: str) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"ha.{name} must be \"host:port\", not {value!r}")


@dataclasses.dataclass(frozen=True)
class HaSettings:
    """``[ha]``: this node's part in a primary/backup group coordinated on
    ZooKeeper.  Without the table the broker runs single-node."""

    node_id: str = ""
    zookeeper: str = ""  # connect string with chroot: "zk-0:2181,zk-1:2181/gateway"
    replication_listen: str = ""  # host:port the primary's replication listener binds
    advertise: str = ""  # host:port the backups reach it at
    # Nodes in the group, as replicated LevelDB's ``replicas``: an election
    # needs final records from replicas - sync_replicas of them (election.quorum).
    replicas: int = 3
    sync_replicas: int = 1  # in-sync backups that must confirm a batch before its receipts
    zookeeper_session_timeout_s: float = 10.0
    sync_timeout_s: float = 10.0
    # Replication link liveness (gateway/ha/liveness.py): each end pings when
    # it sent nothing for link_heartbeat_s and drops a link silent for
    # link_timeout_s; a backup then reconnects at most link_timeout_s / 4 apart.
    link_heartbeat_s: float = 0.5
    link_timeout_s: float = 2.0
    # The group's shared secret, which every replication link proves on both
    # ends (persistence/replica/handshake.py): a file holding it (a mounted
    # Kubernetes Secret), else GATEWAY_CLUSTER_SECRET.  Without one the
    # replication listener binds loopback only, unless open_links = true.
    cluster_secret_file: str = ""
    open_links: bool = False
    # TLS on the replication link (encryption, and certificates both ways),
    # with the [tls] cert, key and ca the client listeners use.
    link_tls: bool = False
    # Read from the file or the environment at load; never a TOML key, never in a repr or a log.
    cluster_secret: bytes = dataclasses.field(default=b"", repr=False)
    # A file holding the group's ZooKeeper digest credentials, user:password
    # (a mounted Secret); or GATEWAY_ZOOKEEPER_AUTH.  Without: open znodes.
    zookeeper_auth_file: str = ""
    # Read from that file or variable at load, never from the TOML (refused
    # there): kept out of repr so that no log line shows it.
    zookeeper_auth: str = dataclasses.field(default="", repr=False)

    def check(self) -> HaSettings:
        """Raise ConfigError unless usable (not at construction: the empty
        defaults are what the TOML reader compares types against)."""
        for name in ("node_id", "zookeeper", "replication_listen", "advertise"):
            if not getattr(self, name):
                variable = f" (or {HA_ENVIRONMENT[name]} in the environment)" if name in HA_ENVIRONMENT else ""
                raise ConfigError(f"ha.{name} is required in [ha]{variable}")
        if not NODE_ID.fullmatch(self.node_id):
            raise ConfigError(f"ha.node_id must be letters, digits, '.', '_' or '-' (at most 64), not {self.node_id!r}")
        hosts = self.zookeeper.partition("/")[0]
        if not hosts or any(not h.strip() for h in hosts.split(",")) or "//" in self.zookeeper:
            raise ConfigError(f"ha.zookeeper must be \"host:port[,host:port...][/chroot]\", not {self.zookeeper!r}")
        _host_port("replication_listen", self.replication_listen)
        _host_port("advertise", self.advertise)
        if self.sync_replicas < 0:
            raise ConfigError(f"ha.sync_replicas must be >= 0, not {self.sync_replicas}")
        if self.replicas < 1 or self.sync_replicas > self.replicas - 1:
            # More backups to confirm than the group has would hold every receipt for ever.
            raise ConfigError(f"ha.replicas must be >= 1 and more than ha.sync_replicas, not replicas = "
                              f"{self.replicas} with sync_replicas = {self.sync_replicas}")
        if self.zookeeper_session_timeout_s <= 0 or self.sync_timeout_s <= 0:
            raise ConfigError("ha.zookeeper_session_timeout_s and ha.sync_timeout_s must be > 0")
        if self.link_heartbeat_s <= 0 or self.link_timeout_s < 3 * self.link_heartbeat_s:
            # A timeout must cover several heartbeats, or one late ping drops a healthy link.
            raise ConfigError(f"ha.link_heartbeat_s must be > 0 and ha.link_timeout_s at least 3 times it, not "
                              f"{self.link_heartbeat_s:g} and {self.link_timeout_s:g}")
        if self.cluster_secret and len(self.cluster_secret) < MIN_SECRET_BYTES:
            raise ConfigError(f"the cluster secret (ha.cluster_secret_file or {CLUSTER_SECRET_ENVIRONMENT}) must be "
                              f"at least {MIN_SECRET_BYTES} bytes, e.g. `openssl rand -hex 32`")
        return self


def _zookeeper_auth(ha: HaSettings, environ: Mapping[str, str]) -> HaSettings:
    """[ha] with the group's ZooKeeper credentials from its file or the environment, checked."""
    variable = environ.get(ZOOKEEPER_AUTH_ENVIRONMENT, "")
    where = ZOOKEEPER_AUTH_ENVIRONMENT
    path = ha.zookeeper_auth_file or environ.get(ZOOKEEPER_AUTH_FILE_ENVIRONMENT, "")
    if path:
        if variable:
            raise ConfigError(f"ha.zookeeper_auth_file (or {ZOOKEEPER_AUTH_FILE_ENVIRONMENT}) and "
                              f"{ZOOKEEPER_AUTH_ENVIRONMENT} are both set: keep one")
        where = f"ha.zookeeper_auth_file {path}"
        try:
            with open(path, "rb") as file:
                raw = file.read(MAX_ZOOKEEPER_AUTH + 2)
        except FileNotFoundError:
            raise ConfigError(f"{where} does not exist") from None
        except OSError as exc:
            raise ConfigError(f"{where}: {exc.strerror}") from None
        try:
            variable = raw.decode("utf-8").rstrip("\r\n")  # a Secret's file often ends with a newline
        except UnicodeDecodeError:
            raise ConfigError(f"{where}: not UTF-8 text") from None
        if not variable:  # named but empty: never "no credentials" by accident
            raise ConfigError(f"{where} is empty: it must hold \"user:password\"")
    if not variable:
        return ha
    user, sep, password = variable.partition(":")
    # ZooKeeper's digest identity is "user:password": no ':' in the user, nothing empty.
    if (not sep or not user or not password or len(variable) > MAX_ZOOKEEPER_AUTH
            or not variable.isprintable()):
        raise ConfigError(f"{where} must hold \"user:password\" (a user without ':', a non-empty password, "
                          f"printable, at most {MAX_ZOOKEEPER_AUTH} characters)")
    return dataclasses.replace(ha, zookeeper_auth=variable)


@dataclasses.dataclass(frozen=True)
class Config:
    # Loopback by default: exposing a broker is a decision (the container
    # image passes --bind 0.0.0.0).
    bind: str = "127.0.0.1"
    stomp_port: int = 61613  # ActiveMQ's default ports
    mqtt_port: int = 1883
    admin_port: int = 8161
    # TLS listeners, started when [tls] names a certificate (ActiveMQ's 61614,
    # MQTT's 8883, ActiveMQ's https console 8162).
    stomp_tls_port: int = 61614
    mqtt_tls_port: int = 8883
    admin_tls_port: int = 8162
    # Connections served at once, in all and from one source address (0: no
    # limit); one past a limit is refused at CONNECT with the reason.
    max_connections: int = 20000
    max_connections_per_address: int = 0
    data_dir: str = "./data"
    log_format: str = "console"
    log_level: str = "info"
    # SIGINT/SIGTERM: how long connections get to close before they are cut.
    shutdown_grace_s: float = 10.0
    stomp: StompSettings = StompSettings()
    mqtt: MqttSettings = MqttSettings()
    broker: BrokerSettings = BrokerSettings()
    store: StoreSettings = StoreSettings()
    admin: AdminSettings = AdminSettings()
    auth: AuthSettings = AuthSettings()
    tls: TlsSettings = TlsSettings()
    ha: HaSettings | None = None  # None: single-node

    def __post_init__(self) -> None:
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"log_format must be one of {', '.join(LOG_FORMATS)}, not {self.log_format!r}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {', '.join(LOG_LEVELS)}, not {self.log_level!r}")
        for name in ("stomp_port", "mqtt_port", "admin_port", "stomp_tls_port", "mqtt_tls_port", "admin_tls_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise ConfigError(f"{name} must be 0-65535, not {port}")
        if self.max_connections < 0 or self.max_connections_per_address < 0:
            raise ConfigError("max_connections and max_connections_per_address must be >= 0 (0: no limit)")
        if self.tls.enabled:
            try:
                server_context(self.tls)  # a wrong path or key fails here, at start-up
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if self.ha is not None and self.ha.link_tls:
            try:
                link_contexts(self.tls)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None


_SECTIONS = {
    "stomp": StompSettings, "mqtt": MqttSettings, "broker": BrokerSettings, "store": StoreSettings, "admin": AdminSettings,
    "auth": AuthSettings, "tls": TlsSettings,
}


def _coerce(where: str, field: dataclasses.Field[Any], value: Any, default: Any) -> Any:
    expected = type(default)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(value) is not expected:
        raise ConfigError(f"{where}: expected {expected.__name__}, got {type(value).__name__} ({value!r})")
    return value


def _build(cls: type, table: dict[str, Any], where: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    defaults = cls()
    values: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        field = fields.get(name)
        if field is None:
            raise ConfigError(f"unknown setting {where}{key!r}")
        default = getattr(defaults, name)
        if dataclasses.is_dataclass(default):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}{key!r} must be a table")
            values[name] = _build(type(default), value, f"{where}{key}.")
        else:
            values[name] = _coerce(f"{where}{key}", field, value, default)
    try:
        return cls(**values)
    except ValueError as exc:  # a settings class refusing a value names it
        raise ConfigError(str(exc)) from None


# A first user from the environment, as RABBITMQ_DEFAULT_USER/_PASS give
# RabbitMQ's: the admin API's (role write) and a messaging client's.  Each is
# hashed at start like a configured user's and checked by the same gate.
ADMIN_USER_ENVIRONMENT = ("GATEWAY_ADMIN_USER", "GATEWAY_ADMIN_PASSWORD")
CLIENT_USER_ENVIRONMENT = ("GATEWAY_USER", "GATEWAY_PASSWORD")


def _environment_user(environ: Mapping[str, str], variables: tuple[str, str],
                      previous: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The user ``variables`` name (both or neither must be set), hashed.  A
    reload keeps the hash ``previous`` (the running config) holds for it: a
    running process's environment does not change, and hashing again would
    cost a PBKDF2 run and look like a changed password."""
    name_variable, password_variable = variables
    name, password = environ.get(name_variable, ""), environ.get(password_variable, "")
    if not name and not password:
        return None
    if not name or not password:
        missing = password_variable if name else name_variable
        raise ConfigError(f"{name_variable} and {password_variable} go together: {missing} is not set")
    kept = next((e["password_hash"] for e in previous if e.get("name") == name), None)
    hashed = kept if kept is not None else hash_password(password)
    return {"name": name, "password_hash": hashed}


# The client users' file when [auth] users_file names none (a Secret's mount).
USERS_FILE_ENVIRONMENT = "GATEWAY_USERS_FILE"


def _with_users_file(built: Config, environ: Mapping[str, str]) -> Config:
    """[auth] users from the users file too, before they are checked together
    (names, the groups the authorization map may name)."""
    path = built.auth.users_file or environ.get(USERS_FILE_ENVIRONMENT, "")
    if not path:
        return built
    try:
        entries = tomllib.loads(Path(path).read_text()).get("users", [])
    except FileNotFoundError:
        raise ConfigError(f"users file {path} does not exist (auth.users_file or {USERS_FILE_ENVIRONMENT})") from None
    except OSError as exc:
        raise ConfigError(f"users file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"users file {path}: {exc}") from None
    if not isinstance(entries, list):
        raise ConfigError(f"users file {path}: users must be a list of tables")
    configured = {e.get("name") for e in built.auth.users}
    twice = sorted(str(e.get("name")) for e in entries if isinstance(e, dict) and e.get("name") in configured)
    if twice:
        raise ConfigError(f"users file {path}: {', '.join(map(repr, twice))} also in [auth] users; remove one")
    try:
        return dataclasses.replace(built, auth=dataclasses.replace(built.auth, users=[*built.auth.users, *entries]))
    except ValueError as exc:
        raise ConfigError(f"users file {path}: {exc}") from None


def _with_environment_users(built: Config, environ: Mapping[str, str], previous: Config | None) -> Config:
    admin = _environment_user(environ, ADMIN_USER_ENVIRONMENT, previous.admin.users if previous else [])
    client = _environment_user(environ, CLIENT_USER_ENVIRONMENT, previous.auth.users if previous else [])
    if admin is not None:
        if any(e.get("name") == admin["name"] for e in built.admin.users):
            raise ConfigError(f"admin user {admin['name']!r} is in [admin] users and in {ADMIN_USER_ENVIRONMENT[0]}; "
                              "remove one")
        admin_users = [*built.admin.users, {**admin, "role": "write"}]
        built = dataclasses.replace(built, admin=dataclasses.replace(built.admin, users=admin_users))
    if client is not None:
        if any(e.get("name") == client["name"] for e in built.auth.users):
            raise ConfigError(f"user {client['name']!r} is in [auth] users (or its users file) and in "
                              f"{CLIENT_USER_ENVIRONMENT[0]}; remove one")
        try:
            auth = dataclasses.replace(built.auth, users=[*built.auth.users, client])
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        built = dataclasses.replace(built, auth=auth)
    return built


def load(path: str | None = None, overrides: dict[str, Any] | None = None,
         environ: Mapping[str, str] | None = None, previous: Config | None = None) -> Config:
    """Read ``path`` (TOML) if given, then apply ``overrides`` (from flags).
    ``environ`` (``os.environ`` for the command) fills in the per-node [ha]
    keys of :data:`HA_ENVIRONMENT` over the file's; without an [ha] table
    they are ignored, so one pod spec also runs a single-node file.  It also
    gives the first users (:data:`ADMIN_USER_ENVIRONMENT`,
    :data:`CLIENT_USER_ENVIRONMENT`).  ``previous``: the running config a
    reload replaces, whose hashes of those users are kept."""
    table: dict[str, Any] = {}
    if path is not None:
        try:
            table = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
    for key, value in (overrides or {}).items():
        if value is not None:
            table[key] = value
    ha = table.pop("ha", None)
    if ha is not None and not isinstance(ha, dict):
        raise ConfigError("'ha' must be a table")
    given = environ or {}
    if ha is not None:
        if "zookeeper_auth" in ha:
            raise ConfigError("ha.zookeeper_auth: credentials do not go into the configuration file; name a file "
                              f"holding them with ha.zookeeper_auth_file, or set {ZOOKEEPER_AUTH_ENVIRONMENT}")
        ha = {**ha, **{key: given[name] for key, name in HA_ENVIRONMENT.items() if given.get(name)}}
    built = _with_environment_users(_with_users_file(_build(Config, table, ""), given), given, previous)
    if ha is None:
        return built
    secret = _cluster_secret(ha, given)
    settings = dataclasses.replace(_build(HaSettings, ha, "ha."), cluster_secret=secret)
    return dataclasses.replace(built, ha=_zookeeper_auth(settings.check(), given))
