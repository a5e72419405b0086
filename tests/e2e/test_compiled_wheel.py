"""The image's compiled build, as deploy/Dockerfile makes it: its build stage
turns the files it copies into a wheel with the hot path compiled by mypyc
(``GATEWAY_MYPYC=1 pip wheel --no-build-isolation``: setup.py, build_fast.py),
and the image runs the broker from that wheel alone.

Here the same wheel is built from the same files, installed into a folder of
its own and run as ``gateway serve`` with that folder first on the path: every
module build_fast.py names loads compiled from it without the compiler's
packages, a STOMP and an MQTT client get through, and receipted persistent
messages survive a SIGKILL.

It needs mypy and a C compiler: ``make test-fast`` installs the pinned mypy and
runs it (CI does); ``make test`` skips it and says so."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest

import build_fast
from tests.support.deploy_helpers import ROOT, dockerfile_stages, dockerignore_excludes
from tests.support.helpers import Client, unique
from tests.support.processes import BrokerProcess, free_port

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None or shutil.which("cc") is None,
    reason="needs mypy and a C compiler (`make test-fast` installs mypy and runs this)",
)


def _run(args: list[str], **kwargs: Any) -> str:
    result = subprocess.run(args, capture_output=True, text=True, timeout=900, **kwargs)
    assert result.returncode == 0, f"{args} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built as the image's build stage builds it, from what that stage copies
    as the build context has it (.dockerignore leaves out bytecode and
    `make fast`'s extensions)."""
    work = tmp_path_factory.mktemp("image-build")
    src = work / "src"
    src.mkdir()

    def left_out(folder: str, names: list[str]) -> list[str]:
        relative = Path(folder).relative_to(ROOT)
        return [name for name in names if dockerignore_excludes((relative / name).as_posix())]

    build_stage = dockerfile_stages()[0]
    for source in (word for copy in build_stage["COPY"] for word in copy.split()[:-1]):
        path = ROOT / source
        assert not dockerignore_excludes(source.rstrip("/")), f"{source} is not in the build context"
        if path.is_dir():
            shutil.copytree(path, src / source, ignore=left_out)
        else:
            shutil.copy2(path, src / source)
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-build-isolation", "--no-deps", "--wheel-dir", str(work / "wheels"), "."],
         cwd=src, env={**os.environ, "GATEWAY_MYPYC": "1"})
    (built,) = (work / "wheels").glob("gateway-*.whl")
    return built


@pytest.fixture(scope="module")
def site(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel installed into a folder of its own (its dependencies are the test venv's)."""
    target = tmp_path_factory.mktemp("image-site")
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)])
    return target


@pytest.fixture
def broker(site: Path, tmp_path: Path) -> Iterator[tuple[BrokerProcess, int]]:
    """``gateway serve`` from the wheel's folder alone, and its MQTT port."""
    mqtt_port = free_port()
    process = BrokerProcess(tmp_path, "--mqtt-port", str(mqtt_port), env={"PYTHONPATH": str(site)})
    yield process, mqtt_port
    process.kill()


def test_the_wheel_is_for_this_python_and_carries_every_listed_module_compiled(wheel: Path) -> None:
    assert not wheel.name.endswith("-py3-none-any.whl"), f"{wheel.name} is a pure wheel"
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in build_fast.FAST_MODULES:
        stem = module.removesuffix(".py")
        assert module in names, f"{module} (the fallback source) is not in the wheel"
        assert any(n.startswith(stem + ".cpython-") and n.endswith(".so") for n in names), f"{module} is not compiled in the wheel"
    assert any(n.startswith("gateway/_fast__mypyc.") for n in names), "the modules' shared library is not in the wheel"


def test_the_installed_wheel_loads_compiled_without_the_compiler(site: Path, tmp_path: Path) -> None:
    names = [m.removesuffix(".py").replace("/", ".") for m in build_fast.FAST_MODULES]
    probe = f"""
import importlib, json, sys
files = {{name: importlib.import_module(name).__file__ for name in {names!r}}}
print(json.dumps({{"files": files, "toolchain": sorted(m for m in sys.modules if m.split(".")[0] in ("mypy", "mypyc", "librt"))}}))
"""
    # From a folder outside the checkout, the wheel's folder first: as in the image.
    found = json.loads(_run([sys.executable, "-c", probe], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)}))
    for name, file in found["files"].items():
        assert file.startswith(str(site)) and file.endswith(".so"), f"{name} loaded from {file}"
    assert found["toolchain"] == [], "the compiled modules import the compiler's packages, which the image does not have"


def test_a_broker_from_the_wheel_serves_stomp_and_mqtt_and_keeps_receipted_messages_through_sigkill(
    broker: tuple[BrokerProcess, int],
) -> None:
    process, mqtt_port = broker
    process.start()
    address = ("127.0.0.1", process.port)

    # MQTT in, STOMP out (the shared core, compiled).
    listener = Client(address).connect()
    listener.subscribe("/topic/sensors.t1")
    listener.barrier()
    publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=unique("wheel"))
    publisher.connect("127.0.0.1", mqtt_port)
    publisher.loop_start()
    try:
        publisher.publish("sensors/t1", b"21.5", qos=1).wait_for_publish(timeout=10)
    finally:
        publisher.loop_stop()
        publisher.disconnect()
    assert listener.wait_messages(1)[0].body == b"21.5"
    listener.close()

    # Receipted persistent SENDs (the compiled store), then SIGKILL.
    queue = f"/queue/{unique('wheel')}"
    producer = Client(address).connect()
    for i in range(200):
        producer.send(queue, f"m{i}", persistent="true")
    producer.close()
    process.kill()
    process.start()
    consumer = Client(address).connect()
    consumer.subscribe(queue)
    assert [m.body for m in consumer.wait_messages(200)] == [f"m{i}".encode() for i in range(200)]
    consumer.close()
