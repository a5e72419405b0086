"""The import contract of STYLE.md §1, enforced so the layering cannot rot.

Codecs import neither Trio nor the core; the core imports neither Trio, the
gateway nor persistence; persistence imports neither Trio nor the gateway, and
of the core only the store port's contract (core/storage.py, a leaf); sockets
and threads stay in the listeners, the admin server and app.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def files(*patterns: str) -> list[Path]:
    out: list[Path] = []
    for pattern in patterns:
        out.extend(sorted(ROOT.glob(pattern)))
    return out


def offending(path: Path, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        name for name in imported_modules(path) if any(name == f or name.startswith(f + ".") for f in forbidden)
    )


CODECS = files("gateway/stomp/codec.py", "gateway/stomp/frames.py", "gateway/mqtt/codec.py",
               "gateway/mqtt/wire.py", "gateway/mqtt/decoders.py", "gateway/mqtt/encoders.py", "gateway/mqtt/packets.py")
CORE = files("core/**/*.py")
PERSISTENCE = files("persistence/**/*.py")
SESSIONS = files("gateway/stomp/session.py", "gateway/mqtt/session.py", "gateway/session/*.py")
# Sockets, tasks and threads: the listeners, the admin port's server and the wiring.
IO_MODULES = files("gateway/transports/server.py", "gateway/admin/server.py", "gateway/app.py")
# Trio stream adapters: they read and write a stream they are given (so they
# import trio) but open no socket and start no task or thread.
ADAPTERS = files("gateway/transports/websocket.py")
NON_IO_GATEWAY = [p for p in files("gateway/**/*.py")
                  if p not in IO_MODULES + ADAPTERS and p.parent.name != "spark"]


def test_there_is_something_to_check() -> None:
    assert CODECS and CORE and SESSIONS


@pytest.mark.parametrize("path", CODECS, ids=lambda p: str(p.relative_to(ROOT)))
def test_codecs_import_neither_trio_nor_core(path: Path) -> None:
    assert offending(path, ("trio", "core", "persistence", "logging", "structlog", "socket", "time")) == []
    # A codec may use its own package's frame/packet definitions and nothing else of ours.
    ours = [n for n in imported_modules(path) if n.startswith("gateway") and not n.startswith(f"gateway.{path.parent.name}")]
    assert ours == []


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(ROOT)))
def test_core_imports_no_trio_gateway_or_persistence(path: Path) -> None:
    assert offending(path, ("trio", "gateway", "persistence", "socket", "threading", "asyncio", "time")) == []


# The one module of the core persistence may import: the store port's contract
# (its records and protocol), a stdlib-only leaf.  The implementation depends on
# the contract it implements, never on the core's classes.
STORE_CONTRACT = "core.storage"


@pytest.mark.parametrize("path", PERSISTENCE, ids=lambda p: str(p.relative_to(ROOT)))
def test_persistence_imports_no_trio_gateway_or_core_but_the_store_contract(path: Path) -> None:
    found = offending(path, ("trio", "gateway", "core", "asyncio"))
    assert [n for n in found if n != STORE_CONTRACT and not n.startswith(STORE_CONTRACT + ".")] == []


def test_the_store_contract_is_a_leaf() -> None:
    path = ROOT / (STORE_CONTRACT.replace(".", "/") + ".py")
    ours = [n for n in imported_modules(path) if n.split(".")[0] in ("core", "gateway", "persistence", "trio")]
    assert ours == []


@pytest.mark.parametrize("path", NON_IO_GATEWAY, ids=lambda p: str(p.relative_to(ROOT)))
def test_only_server_admin_and_app_own_sockets_and_tasks(path: Path) -> None:
    assert offending(path, ("trio", "socket", "threading", "asyncio")) == []


@pytest.mark.parametrize("path", ADAPTERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_stream_adapters_own_no_sockets_or_threads(path: Path) -> None:
    assert offending(path, ("socket", "threading", "asyncio")) == []
    # ...nor tasks: no nursery of their own.
    assert "open_nursery" not in path.read_text()


SPARK = files("gateway/spark/*.py")
# What gateway.spark may use of ours: the STOMP codec (client role) and the
# shared name rules.  It runs inside Spark's Python workers, far from a broker.
SPARK_MAY_IMPORT = ("gateway.spark", "gateway.stomp.codec", "gateway.stomp.frames", "gateway.mqtt.topics", "core.names")


@pytest.mark.parametrize("path", SPARK, ids=lambda p: str(p.relative_to(ROOT)))
def test_spark_is_a_network_client_of_the_broker(path: Path) -> None:
    ours = [n for n in imported_modules(path) if n.split(".")[0] in ("gateway", "core", "persistence")]
    packages = ("gateway", "gateway.stomp", "gateway.mqtt", "core")  # `from core import names` names "core" too
    allowed = [n for n in ours if n in packages or any(n == a or n.startswith(a + ".") for a in SPARK_MAY_IMPORT)]
    assert sorted(set(ours) - set(allowed)) == [] and offending(path, ("trio",)) == []


def test_the_contract_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "codec.py"
    bad.write_text("import trio\nfrom core.broker import Broker\n")
    assert offending(bad, ("trio", "core")) == ["core.broker", "core.broker.Broker", "trio"]
