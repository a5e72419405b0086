"""The brokers benchmarks/peers.py compares, as plain child processes on
127.0.0.1 (stdlib only): gateway from this checkout, Debian's Mosquitto (MQTT
only), Debian's ActiveMQ 5.17 (STOMP and MQTT) and Debian's RabbitMQ 3.10
(its STOMP and MQTT plugins).

Each start gets fresh ports, a fresh temporary folder holding its own config
and data, and runs through harness/broker.py's exec shim (SIGKILL if the runner
dies), so the pid the load generator samples with --pid is the broker itself.
A peer that is not installed is reported with the reason (``missing()``); one
that does not accept connections within the deadline raises ScenarioFailed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness.broker import EXEC_SHIM, HOST, ROOT, ScenarioFailed, free_port, proc_tree

ACTIVEMQ_HOME = Path("/usr/share/activemq")
JAVA_LIB = Path("/usr/share/java")
# What ActiveMQ's MQTT transport needs besides activemq-mqtt.jar (Debian: libmqtt-client-java).
ACTIVEMQ_MQTT_JARS = ("mqtt-client.jar", "hawtdispatch.jar", "hawtdispatch-transport.jar")

GATEWAY_CMD = ("{python} -m gateway serve --bind 127.0.0.1 --stomp-port {stomp_port} --mqtt-port {mqtt_port} "
               "--admin-port 0 --data-dir {data_dir} --log-level warning")

MOSQUITTO_CONF = """\
listener {mqtt_port} 127.0.0.1
# started as root it would switch to user mosquitto, which clears the exec shim's
# parent-death signal; as any other user this line does nothing
user root
allow_anonymous true
persistence false
# no cap on a subscriber's queued QoS 1 messages (the default 1000 drops beyond it)
max_queued_messages 0
log_dest stderr
log_type error
log_type warning
"""

ACTIVEMQ_XML = """\
<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans.xsd
  http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" useJmx="false" brokerName="bench"
          dataDirectory="{data_dir}" schedulerSupport="false">
    <persistenceAdapter><kahaDB directory="{data_dir}/kahadb"/></persistenceAdapter>
    <!-- an explicit memory limit well under the heap, so producer flow control holds a flood
         back before the heap runs out (with 512 MiB and the default m1 ran out of heap) -->
    <systemUsage><systemUsage><memoryUsage><memoryUsage limit="{memory_limit}"/></memoryUsage></systemUsage></systemUsage>
    <transportConnectors>
      <transportConnector name="stomp" uri="{stomp_scheme}://127.0.0.1:{stomp_port}"/>
{mqtt_connector}    </transportConnectors>
  </broker>
</beans>
"""


RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
RABBITMQ_CONF = """\
listeners.tcp.default = 127.0.0.1:{amqp_port}
stomp.listeners.tcp.1 = 127.0.0.1:{stomp_port}
mqtt.listeners.tcp.1 = 127.0.0.1:{mqtt_port}
loopback_users = none
log.console = true
log.console.level = warning
log.file = false
"""


def debian_version(name: str, package: str) -> str:
    """``name`` and the version of the Debian ``package`` it came from."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True, timeout=10)
        return f"{name} {out.stdout.strip() or '?'} (Debian)"
    except (OSError, subprocess.SubprocessError):
        return f"{name} ?"


class PeerBroker:
    """One broker kind; ``start()`` launches a fresh instance, ``stop()`` ends it."""

    name = "?"
    protocols: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.tmp: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.stomp_port = 0
        self.mqtt_port = 0
        self.command: list[str] = []
        self.cpus: str | None = None  # taskset's CPU list for the broker (and every thread it starts)
        self.bench_args: list[str] = []  # what brokerbench needs to say to this broker

    # -- what a subclass says --------------------------------------------------
    def missing(self) -> str | None:
        """Why this broker cannot run here, or None."""
        return None

    def missing_for(self, protocols: set[str]) -> str | None:
        """Why it cannot run a scenario needing ``protocols``, or None."""
        lacking = protocols - set(self.protocols)
        return f"{self.name} does not speak {', '.join(sorted(lacking))}" if lacking else None

    def version(self) -> str:
        return ""

    def build_command(self, tmp: Path) -> tuple[list[str], dict[str, str] | None]:
        raise NotImplementedError

    # -- lifecycle -----------------------------------------------------------
    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    def start(self, timeout: float) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix=f"peers-{self.name}-"))
        self.stomp_port = free_port() if "stomp" in self.protocols else 0
        self.mqtt_port = free_port() if "mqtt" in self.protocols else 0
        cmd, env = self.build_command(self.tmp)
        if self.cpus:
            cmd = ["taskset", "-c", self.cpus, *cmd]  # exec'd: the broker keeps this pid
        self.command = cmd
        with open(self.tmp / "broker.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", EXEC_SHIM, str(os.getpid()), *cmd], stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp, env=env, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        for port in (p for p in (self.stomp_port, self.mqtt_port) if p):
            while True:
                if self.proc.poll() is not None:
                    raise ScenarioFailed(f"{self.name} exited with code {self.proc.returncode} at startup: "
                                         f"{self.log_tail()}")
                try:
                    with socket.create_connection((HOST, port), timeout=0.5):
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise ScenarioFailed(f"{self.name} did not accept connections on {HOST}:{port} "
                                         f"within {timeout:.0f} s: {self.log_tail()}")
                time.sleep(0.05)

    def stop(self, wait: float = 10.0) -> None:
        """SIGTERM, SIGKILL after ``wait`` s, then its whole tree; never raises."""
        proc = self.proc
        if proc is not None:
            tree = proc_tree(proc.pid) if proc.poll() is None else []
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(wait)
                except subprocess.TimeoutExpired:
                    pass
            for p in [proc.pid, *tree] if proc.poll() is None else tree[1:]:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            self.proc = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def log_tail(self, lines: int = 8) -> str:
        try:
            text = (self.tmp / "broker.log").read_text(errors="replace").strip() if self.tmp else ""
        except OSError:
            return ""
        return " | ".join(text.splitlines()[-lines:])


class Gateway(PeerBroker):
    name = "gateway"
    protocols = ("stomp", "mqtt")

    def __init__(self, template: str | None = None) -> None:
        super().__init__()
        self.template = template or GATEWAY_CMD

    def version(self) -> str:
        try:
            out = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                                 capture_output=True, text=True, timeout=10)
            return f"checkout {ROOT} at {out.stdout.strip() or '?'}"
        except (OSError, subprocess.SubprocessError):
            return f"checkout {ROOT}"

    def build_command(self, tmp: Path) -> tuple[list[str], dict[str, str] | None]:
        cmd = self.template.format(python=shlex.quote(sys.executable), stomp_port=self.stomp_port,
                                   mqtt_port=self.mqtt_port, data_dir=shlex.quote(str(tmp / "data")))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
        return shlex.split(cmd), env


class Mosquitto(PeerBroker):
    name = "mosquitto"
    protocols = ("mqtt",)

    def __init__(self) -> None:
        super().__init__()
        self.binary = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else "")

    def missing(self) -> str | None:
        if not self.binary:
            return "mosquitto not installed (apt-get install -y mosquitto)"
        return None

    def version(self) -> str:
        try:
            out = subprocess.run([self.binary, "-h"], capture_output=True, text=True, timeout=10)
            return (out.stdout or out.stderr).splitlines()[0].strip()
        except (OSError, subprocess.SubprocessError, IndexError):
            return "?"

    def build_command(self, tmp: Path) -> tuple[list[str], dict[str, str] | None]:
        conf = tmp / "mosquitto.conf"
        conf.write_text(MOSQUITTO_CONF.format(mqtt_port=self.mqtt_port))
        return [self.binary, "-c", str(conf)], None


class ActiveMQ(PeerBroker):
    name = "activemq"

    def __init__(self, nio: bool = False, heap: str = "1G", memory_limit: str = "256 mb") -> None:
        super().__init__()
        self.java = shutil.which("java") or ""
        self.jar = ACTIVEMQ_HOME / "bin" / "activemq.jar"
        self.nio = nio
        self.heap = heap
        self.memory_limit = memory_limit
        self.mqtt_jars = [JAVA_LIB / j for j in ACTIVEMQ_MQTT_JARS]
        self.mqtt_reason = ""
        if not (ACTIVEMQ_HOME / "lib" / "activemq-mqtt.jar").exists():
            self.mqtt_reason = "activemq-mqtt.jar not found"
        elif not all(j.exists() for j in self.mqtt_jars):
            absent = ", ".join(j.name for j in self.mqtt_jars if not j.exists())
            self.mqtt_reason = f"ActiveMQ's MQTT transport lacks {absent} (apt-get install -y libmqtt-client-java)"
        self.protocols = ("stomp",) if self.mqtt_reason else ("stomp", "mqtt")

    def missing(self) -> str | None:
        if not self.jar.exists():
            return f"{self.jar} not found (apt-get install -y activemq)"
        if not self.java:
            return "no java on PATH"
        return None

    def missing_for(self, protocols: set[str]) -> str | None:
        if "mqtt" in protocols and self.mqtt_reason:
            return self.mqtt_reason
        return super().missing_for(protocols)

    def version(self) -> str:
        return debian_version("ActiveMQ", "activemq")

    def build_command(self, tmp: Path) -> tuple[list[str], dict[str, str] | None]:
        data, conf, lib = tmp / "data", tmp / "conf", tmp / "lib"
        for d in (data, conf, lib):
            d.mkdir()
        mqtt = ""
        if "mqtt" in self.protocols:
            for jar in self.mqtt_jars:  # activemq.base/lib is on its classpath
                (lib / jar.name).symlink_to(jar)
            mqtt = f'      <transportConnector name="mqtt" uri="{self.scheme("mqtt")}://127.0.0.1:{self.mqtt_port}"/>\n'
        (conf / "activemq.xml").write_text(ACTIVEMQ_XML.format(
            data_dir=data, memory_limit=self.memory_limit, stomp_scheme=self.scheme("stomp"), stomp_port=self.stomp_port, mqtt_connector=mqtt))
        (conf / "log4j2.properties").write_text(
            "rootLogger.level=WARN\nrootLogger.appenderRef.console.ref=Console\n"
            "appender.console.type=Console\nappender.console.name=Console\n"
            "appender.console.layout.type=PatternLayout\nappender.console.layout.pattern=%5p | %m%n\n")
        return [
            self.java, f"-Xms{self.heap}", f"-Xmx{self.heap}", f"-Dactivemq.home={ACTIVEMQ_HOME}",
            f"-Dactivemq.base={tmp}", f"-Dactivemq.conf={conf}", f"-Dactivemq.data={data}",
            f"-Dlog4j.configurationFile={conf / 'log4j2.properties'}", "-jar", str(self.jar),
            "start", f"xbean:file:{conf / 'activemq.xml'}",
        ], None

    def scheme(self, protocol: str) -> str:
        return f"{protocol}+nio" if self.nio else protocol


class RabbitMQ(PeerBroker):
    """Debian's RabbitMQ with its STOMP and MQTT plugins, as a node of its own:
    a fresh node name, ports, Mnesia folder, cookie (HOME) and epmd port, so it
    neither meets nor leaves behind anything of a system RabbitMQ.  Its start
    script forks the Erlang VM and waits for it, so :attr:`pid` is the VM's
    (``beam.smp``), the process whose CPU is the broker's."""

    name = "rabbitmq"
    protocols = ("stomp", "mqtt")

    def __init__(self) -> None:
        super().__init__()
        self.epmd_port = 0
        # STOMP's host header names the virtual host.  Publishers and receivers
        # get 120 s, not brokerbench's 20, to send and take a scenario's count:
        # its s3 fan-out (1.6 million deliveries) takes longer than that here.
        self.bench_args = ["--vhost", "/", "--max-time", "120", "--drain", "120"]

    def missing(self) -> str | None:
        if not RABBITMQ_SERVER.exists():
            return f"{RABBITMQ_SERVER} not found (apt-get install -y rabbitmq-server)"
        return None

    def version(self) -> str:
        return debian_version("RabbitMQ", "rabbitmq-server")

    def build_command(self, tmp: Path) -> tuple[list[str], dict[str, str] | None]:
        self.epmd_port = free_port()
        (tmp / "rabbitmq.conf").write_text(RABBITMQ_CONF.format(
            amqp_port=free_port(), stomp_port=self.stomp_port, mqtt_port=self.mqtt_port))
        (tmp / "enabled_plugins").write_text("[rabbitmq_stomp,rabbitmq_mqtt].\n")
        env = dict(os.environ, HOME=str(tmp), RABBITMQ_NODENAME=f"bench{self.epmd_port}@localhost",
                   RABBITMQ_NODE_IP_ADDRESS=HOST, RABBITMQ_DIST_PORT=str(free_port()),
                   RABBITMQ_CONFIG_FILE=str(tmp / "rabbitmq"), RABBITMQ_ENABLED_PLUGINS_FILE=str(tmp / "enabled_plugins"),
                   RABBITMQ_MNESIA_BASE=str(tmp / "mnesia"), RABBITMQ_LOG_BASE=str(tmp / "log"),
                   RABBITMQ_PID_FILE=str(tmp / "pid"), ERL_EPMD_ADDRESS=HOST, ERL_EPMD_PORT=str(self.epmd_port))
        return [str(RABBITMQ_SERVER)], env

    @property
    def pid(self) -> int:
        if self.proc is None:
            return 0
        for p in proc_tree(self.proc.pid):
            try:
                if Path(f"/proc/{p}/comm").read_text().strip() == "beam.smp":
                    return p
            except OSError:
                continue
        return self.proc.pid

    def stop(self, wait: float = 10.0) -> None:
        super().stop(wait)
        # epmd daemonizes (its parent is init, not the node), so it is found by
        # the port this node gave it, in its environment.
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                comm = Path(f"/proc/{entry}/comm").read_text().strip()
            except OSError:
                continue
            if comm == "epmd" and f"ERL_EPMD_PORT={self.epmd_port}".encode() in environ:
                try:
                    os.kill(int(entry), signal.SIGKILL)
                except OSError:
                    pass
