"""What the broker leaves on disk is its own: started from a shell with
umask 022 on a fresh data folder, the folder is 0700 and every file in it
(journal segments, the checkpoint, the clean-shutdown marker, the lock file,
topic archives and their indexes) 0600; a folder an older version left open
is tightened at the next start, said once.  A secret file other users can
read (a users file, the admin users file, the TLS key) is warned about at
start, once per file."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from gateway.auth import hash_password
from tests.support.helpers import Client
from tests.support.processes import HOST, BrokerProcess

ARCHIVING = """
[[broker.policies]]
destination = "/topic/plant.>"
archive = true
"""


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """The umask a shell would give the broker (it inherits the test's)."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(folder: Path) -> dict[str, int]:
    """Every folder and file under ``folder`` (itself as "."), by relative path."""
    found = {".": stat.S_IMODE(folder.lstat().st_mode)}
    for path in folder.rglob("*"):
        found[str(path.relative_to(folder))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def events(broker: BrokerProcess, name: str) -> list[dict]:
    lines = broker.log_path.read_text(errors="replace").splitlines()
    return [e for e in (json.loads(line) for line in lines if line.startswith("{")) if e.get("event") == name]


def write_persistent_messages(broker: BrokerProcess) -> None:
    client = Client((HOST, broker.port)).connect()
    try:
        for i in range(20):
            client.send("/queue/orders", f"order {i}", persistent="true")
            client.send("/topic/plant.1.temp", f"{i} C", persistent="true")
    finally:
        client.conn.disconnect()


def start(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> BrokerProcess:
    config = tmp_path / "gateway.toml"
    if not config.exists():
        config.write_text(ARCHIVING)
    broker = BrokerProcess(tmp_path, "--config", str(config), "--log-format", "json", *extra, env=env)
    with umask(0o022):
        broker.start()
    return broker


def test_the_data_folder_and_every_file_in_it_are_owner_only_under_umask_022(tmp_path):
    broker = start(tmp_path)
    write_persistent_messages(broker)
    assert broker.terminate() == 0  # a clean stop writes the checkpoint and the clean marker too
    found = modes(broker.data_dir)
    kinds = {Path(p).parts[0] for p in found if p != "."}
    assert {"store", "archive"} <= kinds, found  # the journal's and the archive's files are among them
    assert any(p.startswith("store/") and p.endswith(".log") for p in found), found
    assert any(p.startswith("archive/") and "/" in p[len("archive/"):] for p in found), found
    folders = {p: m for p, m in found.items() if (broker.data_dir / p).is_dir()}
    files = {p: m for p, m in found.items() if p not in folders}
    assert files and all(m == 0o600 for m in files.values()), {p: oct(m) for p, m in files.items()}
    assert all(m == 0o700 for m in folders.values()), {p: oct(m) for p, m in folders.items()}
    assert not events(broker, "data_folder_tightened")  # nothing to tighten in a folder it made


def test_a_data_folder_left_open_is_tightened_at_start_and_said_once(tmp_path):
    broker = start(tmp_path)
    write_persistent_messages(broker)
    assert broker.terminate() == 0
    # As an older version under umask 022 left it.
    for path in [broker.data_dir, *broker.data_dir.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    with umask(0o022):
        broker.start()
    (tightened,) = events(broker, "data_folder_tightened")
    assert tightened["mode"] == "0755" and tightened["files"] > 2
    assert broker.terminate() == 0
    found = modes(broker.data_dir)
    assert all(m == (0o700 if (broker.data_dir / p).is_dir() else 0o600) for p, m in found.items()), \
        {p: oct(m) for p, m in found.items()}
    client_messages = Client((HOST, broker.port))  # and the store still reads: the messages are there
    broker.start()
    try:
        client_messages.connect()
        client_messages.subscribe("/queue/orders")
        assert len(client_messages.wait_messages(20)) == 20
    finally:
        client_messages.conn.disconnect()
        broker.terminate()


def test_secret_files_other_users_can_read_are_warned_about_once_each(tmp_path, pki):
    entry = 'users = [{name = "%s", password_hash = "%s"%s}]\n'
    users = tmp_path / "users.toml"
    users.write_text(entry % ("app", hash_password("pw", iterations=1000), ""))
    users.chmod(0o644)  # world-readable
    admins = tmp_path / "admins.toml"
    admins.write_text(entry % ("ops", hash_password("pw", iterations=1000), ', role = "read"'))
    admins.chmod(0o640)  # group-readable, and the broker owns it: no group needed
    key = Path(pki["server"])
    key.chmod(0o600)  # owner-only: fine
    (tmp_path / "gateway.toml").write_text(
        "stomp_tls_port = 0\nmqtt_tls_port = 0\nadmin_tls_port = 0\n"
        f'[admin]\nusers_file = "{admins}"\n[tls]\ncert = "{key}"\nkey = "{key}"\n')
    broker = start(tmp_path, env={"GATEWAY_USERS_FILE": str(users)})
    try:
        warned = events(broker, "secret_file_readable")
        assert sorted((w["file"], w["mode"]) for w in warned) == sorted([(str(users), "0644"), (str(admins), "0640")])
        assert all("chmod go-rwx" in w["detail"] for w in warned)
    finally:
        broker.terminate()
    key.chmod(0o644)
    users.chmod(0o600)
    admins.chmod(0o600)
    broker.start()
    try:
        warned = events(broker, "secret_file_readable")[2:]  # this lifetime's
        assert [(w["file"], w["what"]) for w in warned] == [(str(key), "TLS key")]
    finally:
        broker.terminate()
