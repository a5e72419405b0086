"""deploy/zookeeper/'s zoo.cfg and probes held against real ZooKeeper servers
(Debian's package, the same server as the official image's, run as three
JVMs on loopback): the ConfigMap's file, read-only, with only the addresses
made loopback ones, forms an ensemble; a lone server is alive but not Ready;
two are a quorum, Ready; one of three may go (the budget's maxUnavailable 1);
and the gateway's connect string, chroot included, works against it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import structlog

from tests.support.deploy_helpers import DEPLOY, pod_spec, render_kubectl, render_python, the
from tests.support.helpers import wait_for
from tests.support.processes import HOST, free_port
from tests.support.zookeeper_helpers import JAVA, ZOOKEEPER_JAR, unavailable_reason

QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
WAIT_S = 60.0  # leader election among cold JVMs on a loaded machine


def _render(base: Path) -> list[dict[str, Any]]:
    try:
        return render_kubectl(base)
    except AssertionError:  # no kubectl
        return render_python(base)


class Server:
    """server.<myid> of the rendered zoo.cfg, on loopback ports of its own."""

    def __init__(self, folder: Path, myid: int) -> None:
        self.myid = myid
        self.folder = folder
        self.data_dir = folder / "data"
        self.data_dir.mkdir(parents=True)
        # What the image's entrypoint writes from ZOO_MY_ID (the pod's ordinal + 1).
        (self.data_dir / "myid").write_text(f"{myid}\n")
        self.client_port, self.quorum_port, self.election_port = free_port(), free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def configure(self, text: str, servers: list[Server], names: dict[str, Server]) -> None:
        """The ConfigMap's zoo.cfg with the addresses made loopback ones, and
        nothing else changed; read-only in a read-only folder, as mounted."""
        def server_line(match: re.Match[str]) -> str:
            peer = names[match[2]]
            return f"server.{match[1]}={HOST}:{peer.quorum_port}:{peer.election_port}"

        text = re.sub(r"(?m)^server\.(\d+)=([^:]+):\d+:\d+$", server_line, text)
        text = re.sub(r"(?m)^dataDir=.*$", f"dataDir={self.data_dir}", text)
        text = re.sub(r"(?m)^clientPort=.*$", f"clientPort={self.client_port}\nclientPortAddress={HOST}", text)
        conf = self.folder / "conf"
        conf.mkdir()
        self.config = conf / "zoo.cfg"
        self.config.write_text(text)
        self.text = text
        self.config.chmod(0o444)
        conf.chmod(0o555)

    def start(self) -> Server:
        assert JAVA is not None
        with (self.folder / "server.log").open("ab") as log:
            self.proc = subprocess.Popen([JAVA, "-Xmx64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp",
                                          str(ZOOKEEPER_JAR), QUORUM_MAIN, str(self.config)],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        return self

    def probe(self, probe: dict[str, Any]) -> bool:
        """The pod's exec probe, its port made this server's; True when it passes."""
        command = [part.replace("/127.0.0.1/2181", f"/{HOST}/{self.client_port}") for part in probe["exec"]["command"]]
        assert command != probe["exec"]["command"], "the probe talks to the client port on 127.0.0.1"
        try:
            return subprocess.run(command, capture_output=True, timeout=probe["timeoutSeconds"] + 5).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            self.proc.wait(timeout=30)

    def log_tail(self) -> str:
        path = self.folder / "server.log"
        lines = path.read_text(errors="replace").splitlines()[-20:] if path.exists() else []
        return f"---- server.{self.myid}\n" + "\n".join(lines)


def test_the_ensemble_forms_a_quorum_and_its_probes_say_when(tmp_path: Path) -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    ensemble = _render(DEPLOY / "zookeeper")
    zk = the(ensemble, "StatefulSet")
    (ctr,) = pod_spec(zk)["containers"]
    text = the(ensemble, "ConfigMap")["data"]["zoo.cfg"]
    servers = [Server(tmp_path / f"zk-{i}", i + 1) for i in range(zk["spec"]["replicas"])]
    names = {f"{zk['metadata']['name']}-{i}.{zk['spec']['serviceName']}": s for i, s in enumerate(servers)}
    for server in servers:
        server.configure(text, servers, names)
    live, ready = ctr["livenessProbe"], ctr["readinessProbe"]

    def wait(what: str, check: Any) -> None:
        def holds() -> bool:
            for server in servers:
                if server.proc is not None and not server.alive() and server.proc.returncode not in (0, 143, -15):
                    raise AssertionError(f"server.{server.myid} exited\n" + server.log_tail())
            return bool(check())

        try:
            wait_for(holds, timeout=WAIT_S, interval=0.5, what=what)
        except AssertionError:
            raise AssertionError(f"{what}\n" + "\n".join(s.log_tail() for s in servers)) from None

    try:
        first = servers[0].start()
        # Alone it answers (alive) but serves nothing: not Ready, so OrderedReady would wait forever.
        wait("a lone server alive", lambda: first.probe(live))
        assert not first.probe(ready), "a server without a quorum must not be Ready"
        servers[1].start()
        wait("two servers Ready (a quorum)", lambda: first.probe(ready) and servers[1].probe(ready))
        servers[2].start()
        wait("all three Ready", lambda: all(s.probe(ready) for s in servers))
        for server in servers:
            assert server.probe(ctr["startupProbe"])

        # The gateway's connect string, its names made these servers: a node joins under the chroot.
        from gateway.ha.coordinator import Coordinator, StateCallbacks
        from gateway.ha.election import NodeRecord, Role
        from tests.support.deploy_helpers import effective_config

        cfg, _ = effective_config(_render(DEPLOY), tmp_path)
        assert cfg.ha is not None
        hosts, _, chroot = cfg.ha.zookeeper.partition("/")
        local = ",".join(f"{HOST}:{names[h.rpartition(':')[0]].client_port}" for h in hosts.split(","))

        def nothing() -> None:
            return None

        coordinator = Coordinator(f"{local}/{chroot}", cfg.ha.node_id, session_timeout_s=cfg.ha.zookeeper_session_timeout_s,
                                  callbacks=StateCallbacks(nothing, nothing, nothing), log=structlog.get_logger("test"))
        try:
            coordinator.connect()
            coordinator.join(NodeRecord(cfg.ha.node_id, cfg.ha.advertise, 0, 0, Role.BACKUP))
            assert coordinator.primary() is None
            assert cfg.ha.node_id in coordinator.client.get_children(f"/{chroot}/nodes")
            # One server away (the budget allows one): the other two still serve, the session goes on.
            servers[0].stop()
            assert not servers[0].probe(live), "a stopped server fails its liveness probe"
            wait("two of three Ready again", lambda: servers[1].probe(ready) and servers[2].probe(ready))
            wait("the session still there", lambda: cfg.ha.node_id in coordinator.client.get_children(f"/{chroot}/nodes"))
        finally:
            coordinator.close()
        # The mounted file was never rewritten (reconfigEnabled=false on a read-only file).
        for server in servers:
            assert server.config.read_text() == server.text and [p.name for p in server.config.parent.iterdir()] == ["zoo.cfg"]
    finally:
        for server in servers:
            if server.proc is not None and server.alive():
                server.proc.kill()
                server.proc.wait(timeout=10)
            if hasattr(server, "config"):
                server.config.parent.chmod(0o755)  # so tmp_path can be removed
