"""deploy/ as an HA group: three pods of one StatefulSet, each its own node
(the [ha] table of the one ConfigMap, read by the broker's own loader with
each pod's environment), only the primary Ready, one node per machine, the
disruption budget; and deploy/zookeeper/, the ensemble the group's connect
string names, rendered and validated like deploy/."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.deploy_helpers import DEPLOY, USER_SECRETS, container, effective_config, pod_names, pod_spec, render_kubectl, render_python, the

kubernetes_validate = pytest.importorskip("kubernetes_validate")
K8S_VERSIONS = ("1.27.0", kubernetes_validate.utils.latest_version())
ZOOKEEPER = DEPLOY / "zookeeper"


@pytest.fixture(scope="module")
def ensemble() -> list[dict[str, Any]]:
    """deploy/zookeeper/ rendered (kubectl's renderer where there is one)."""
    try:
        return render_kubectl(ZOOKEEPER)
    except AssertionError:  # no kubectl
        return render_python(ZOOKEEPER)


def zoo_cfg(ensemble: list[dict[str, Any]]) -> dict[str, str]:
    text = the(ensemble, "ConfigMap")["data"]["zoo.cfg"]
    pairs = [line.split("=", 1) for line in text.splitlines() if line.strip() and not line.startswith("#")]
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"a key twice in zoo.cfg: {keys}"
    return dict(pairs)


def test_three_nodes_start_together_and_roll_in_the_operators_order(rendered: list[dict[str, Any]]) -> None:
    sts = the(rendered, "StatefulSet")
    assert sts["spec"]["replicas"] == 3
    # Only the primary is ever Ready: OrderedReady would never create gateway-1.
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    # RollingUpdate waits for each updated pod to be Ready (a backup never is)
    # and ignores which pod is primary: the operator deletes the primary last.
    assert sts["spec"]["updateStrategy"]["type"] == "OnDelete"
    readme = (DEPLOY / "README.md").read_text()
    assert "OnDelete" in readme and "Rolling upgrade" in readme


def test_no_two_nodes_share_a_machine(rendered: list[dict[str, Any]]) -> None:
    sts = the(rendered, "StatefulSet")
    pod = pod_spec(sts)
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    # It selects exactly this StatefulSet's pods: its own template's labels, the set's selector.
    selector = term["labelSelector"]["matchLabels"]
    assert selector == sts["spec"]["selector"]["matchLabels"]
    assert selector.items() <= sts["spec"]["template"]["metadata"]["labels"].items()


def test_every_pod_is_its_own_node_of_one_group(rendered: list[dict[str, Any]], ensemble: list[dict[str, Any]],
                                                tmp_path: Path) -> None:
    sts = the(rendered, "StatefulSet")
    ctr = container(rendered)
    replication = next(p for p in ctr["ports"] if p["name"] == "replication")
    headless = the(rendered, "Service", sts["spec"]["serviceName"])
    pods = pod_names(rendered)
    nodes = {}
    for pod in pods:
        (tmp_path / pod).mkdir()
        cfg, _ = effective_config(rendered, tmp_path / pod, pod)  # the broker's own loader, the pod's environment
        assert cfg.ha is not None, "the ConfigMap's file has an [ha] table"
        nodes[pod] = cfg.ha
    # Distinct node ids, each its pod's name; each advertises its own stable DNS name.
    assert [nodes[p].node_id for p in pods] == pods == ["gateway-0", "gateway-1", "gateway-2"]
    for pod, ha in nodes.items():
        host, _, port = ha.advertise.rpartition(":")
        assert host == f"{pod}.{headless['metadata']['name']}"
        assert int(port) == int(ha.replication_listen.rpartition(":")[2]) == replication["containerPort"]
        assert ha.replication_listen.startswith("0.0.0.0:"), "the pod's IP is not known in advance"
    # Everything else is the group's, the same in every pod.
    shared = {(h.zookeeper, h.replication_listen, h.replicas, h.sync_replicas, h.zookeeper_session_timeout_s,
               h.sync_timeout_s, h.cluster_secret) for h in nodes.values()}
    assert len(shared) == 1
    # The cluster secret: one for the group, from a Secret the user creates
    # (never one shipped in the repository), so the listener binds the pod's
    # addresses as configured instead of loopback only.
    from gateway.ha.primary_role import replication_bind
    from tests.support.deploy_helpers import USER_SECRETS

    assert nodes[pods[0]].cluster_secret == USER_SECRETS["gateway-cluster-secret", "secret"].encode()
    assert not nodes[pods[0]].open_links
    assert all(replication_bind(h) == ("0.0.0.0", replication["containerPort"]) for h in nodes.values())
    secret_refs = [e["valueFrom"]["secretKeyRef"] for e in ctr["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    assert secret_refs == [{"name": "gateway-cluster-secret", "key": "secret"}]
    assert not [o for o in rendered if o["kind"] == "Secret" and "cluster" in o["metadata"]["name"]]
    # The group's size, which an election's quorum counts from, is the StatefulSet's.
    assert nodes[pods[0]].replicas == len(pods)
    # One backup away (an upgrade, a drain) still leaves sync_replicas backups to confirm.
    assert 1 <= nodes[pods[0]].sync_replicas <= len(pods) - 2
    # The backups reach the replication port through the headless Service,
    # whose names exist before a pod is Ready (a backup never is).
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert {"name": "replication", "port": replication["containerPort"], "targetPort": "replication"} in headless["spec"]["ports"]

    # The connect string names the ensemble's servers by their stable names and client port, with a chroot.
    connect = nodes[pods[0]].zookeeper
    hosts, _, chroot = connect.partition("/")
    assert chroot and "/" not in chroot, "the group's znodes under one chroot"
    zk = the(ensemble, "StatefulSet")
    zk_ctr = pod_spec(zk)["containers"][0]
    client = next(p["containerPort"] for p in zk_ctr["ports"] if p["name"] == "client")
    zk_pods = [f"{zk['metadata']['name']}-{i}" for i in range(zk["spec"]["replicas"])]
    assert hosts.split(",") == [f"{p}.{zk['spec']['serviceName']}:{client}" for p in zk_pods]
    # The session timeout the group asks for is one the ensemble grants (2 to 20 ticks by default).
    cfg = zoo_cfg(ensemble)
    tick_s = int(cfg["tickTime"]) / 1000
    low = int(cfg.get("minSessionTimeout", 2 * tick_s * 1000)) / 1000
    high = int(cfg.get("maxSessionTimeout", 20 * tick_s * 1000)) / 1000
    assert low <= nodes[pods[0]].zookeeper_session_timeout_s <= high


def test_only_the_primary_is_ready_and_probes_say_so(rendered: list[dict[str, Any]]) -> None:
    ctr = container(rendered)
    pod = pod_spec(the(rendered, "StatefulSet"))
    # /readyz answers 200 on the primary alone (test_deploy_runtime.py runs the group): the Service routes to it.
    assert ctr["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert ctr["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # A new primary gets its clients within seconds of taking over.
    readiness = ctr["readinessProbe"]
    assert readiness["periodSeconds"] * readiness["failureThreshold"] <= 10
    assert pod["terminationGracePeriodSeconds"] <= 60, "a deleted primary hands over within a minute"


def test_the_disruption_budget_never_evicts_the_primary(rendered: list[dict[str, Any]]) -> None:
    pdb = the(rendered, "PodDisruptionBudget")
    sts = the(rendered, "StatefulSet")
    assert pdb["spec"]["maxUnavailable"] == 1
    # Kubernetes counts Ready pods as healthy: 1 (the primary) of the 2 the
    # budget wants, so the primary is never evicted, and backups (never Ready)
    # could not be either without AlwaysAllow.
    assert sts["spec"]["replicas"] - pdb["spec"]["maxUnavailable"] > 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdb["spec"]["selector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]


def test_the_ensemble_renders_the_expected_objects(ensemble: list[dict[str, Any]]) -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"].rsplit("-", 1)[0] if o["kind"] == "ConfigMap" else o["metadata"]["name"])
                   for o in ensemble)
    assert kinds == [("ConfigMap", "zookeeper-config"), ("NetworkPolicy", "zookeeper"), ("PodDisruptionBudget", "zookeeper"),
                     ("Service", "zookeeper"), ("Service", "zookeeper-headless"), ("StatefulSet", "zookeeper")]
    for obj in ensemble:
        assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == "zookeeper"
        assert "namespace" not in obj["metadata"]


def test_the_python_renderer_matches_kubectl_for_the_ensemble() -> None:
    try:
        expected = render_kubectl(ZOOKEEPER)
    except AssertionError:
        pytest.skip("kubectl is not installed: the comparison needs it")

    def keyed(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
        return {(obj["kind"], obj["metadata"]["name"]): obj for obj in objects}

    assert keyed(render_python(ZOOKEEPER)) == keyed(expected)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_ensemble_object_is_valid_in_strict_mode(ensemble: list[dict[str, Any]], version: str) -> None:
    for obj in ensemble:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{obj['kind']}/{obj['metadata']['name']} is invalid for Kubernetes {version}: {exc.caught}") from None


def test_the_ensemble_is_three_official_servers_that_know_each_other(ensemble: list[dict[str, Any]], tmp_path: Path) -> None:
    zk = the(ensemble, "StatefulSet")
    pod = pod_spec(zk)
    (ctr,) = pod["containers"]
    assert zk["spec"]["replicas"] == 3
    assert zk["spec"]["podManagementPolicy"] == "Parallel", "a lone server is never Ready (no quorum)"
    name, _, tag = ctr["image"].partition(":")
    assert name == "zookeeper" and tag.count(".") == 2 and tag.replace(".", "").isdigit(), "the official image, pinned"
    # zoo.cfg lists server.(N+1) = zookeeper-N by its stable name, on the declared ports.
    cfg = zoo_cfg(ensemble)
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    assert int(cfg["clientPort"]) == ports["client"]
    servers = {k: v for k, v in cfg.items() if k.startswith("server.")}
    assert servers == {f"server.{i + 1}": f"{zk['metadata']['name']}-{i}.{zk['spec']['serviceName']}:{ports['quorum']}:{ports['election']}"
                       for i in range(zk["spec"]["replicas"])}
    assert cfg["reconfigEnabled"] == "false", "the mounted file is read-only: ZooKeeper must not rewrite it"
    headless = the(ensemble, "Service", zk["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    # The mounted zoo.cfg is the ConfigMap's, so the image writes none of its own.
    mount = next(m for m in ctr["volumeMounts"] if m["mountPath"] == "/conf/zoo.cfg")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == the(ensemble, "ConfigMap")["metadata"]["name"] and mount["subPath"] == "zoo.cfg"
    # The command gives zookeeper-N the id N+1 (what the image's entrypoint
    # writes into myid), then execs the entrypoint: run it with a stand-in.
    assert ctr["command"] == ["/bin/bash", "-c"]
    (script,) = ctr["args"]
    assert "exec /docker-entrypoint.sh zkServer.sh start-foreground" in script
    stand_in = tmp_path / "entrypoint.sh"
    stand_in.write_text('#!/bin/sh\necho "$ZOO_MY_ID $*"\n')
    stand_in.chmod(0o755)
    for i in range(zk["spec"]["replicas"]):
        env = {**os.environ, "HOSTNAME": f"{zk['metadata']['name']}-{i}"}
        out = subprocess.run(["/bin/bash", "-c", script.replace("/docker-entrypoint.sh", str(stand_in))], env=env,
                             capture_output=True, text=True, timeout=30, check=True).stdout
        assert out.split() == [str(i + 1), "zkServer.sh", "start-foreground"]
    # Evictions one at a time: the quorum (2 of 3) holds.
    pdb = the(ensemble, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    term = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == zk["spec"]["selector"]["matchLabels"]


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and In/NotIn/Exists/DoesNotExist) against a pod's labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for term in selector.get("matchExpressions", []):
        key, operator, values = term["key"], term["operator"], term.get("values", [])
        held = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
                "Exists": key in labels, "DoesNotExist": key not in labels}[operator]
        if not held:
            return False
    return True


def test_only_the_broker_pods_and_the_servers_reach_zookeeper(rendered: list[dict[str, Any]],
                                                             ensemble: list[dict[str, Any]]) -> None:
    """deploy/zookeeper/'s NetworkPolicy, evaluated against the pods as rendered:
    a broker pod reaches the client port only, a server every port of the
    ensemble, any other pod of the namespace nothing."""
    policy = the(ensemble, "NetworkPolicy")
    servers = the(ensemble, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    brokers = the(rendered, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    # A pod that shares a label with each (app.kubernetes.io/part-of) but is neither: a console, a job.
    other = {"app.kubernetes.io/part-of": "gateway", "app.kubernetes.io/instance": "gateway-tools"}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert selects(policy["spec"]["podSelector"], servers)
    assert not selects(policy["spec"]["podSelector"], brokers)
    zk_ports = {p["name"] for p in pod_spec(the(ensemble, "StatefulSet"))["containers"][0]["ports"]}

    def admitted(labels: dict[str, str]) -> set[str]:
        ports: set[str] = set()
        for rule in policy["spec"]["ingress"]:
            assert rule.get("from"), "a rule without 'from' admits every pod"
            assert all(set(peer) == {"podSelector"} for peer in rule["from"]), "pods of this namespace only"
            if any(selects(peer["podSelector"], labels) for peer in rule["from"]):
                assert rule.get("ports"), "a rule without 'ports' admits every port"
                ports |= {p["port"] for p in rule["ports"]}
        return ports

    assert admitted(brokers) == {"client"}
    assert admitted(servers) == {"client", "quorum", "election"} == zk_ports
    assert admitted(other) == set() and admitted({}) == set()
    # Every broker pod is a client of the ensemble its connect string names (test above).
    assert brokers["app.kubernetes.io/instance"] == "gateway"


def test_the_nodes_authenticate_to_zookeeper_with_a_secret(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    """GATEWAY_ZOOKEEPER_AUTH_FILE names the key of Secret gateway-zookeeper-auth,
    mounted read-only for the broker alone; the Secret is the user's to create
    (none is shipped: a credential in the repository would be everyone's);
    every pod loads the same identity, so the znodes one node creates the
    others may use."""
    from gateway.config import ZOOKEEPER_AUTH_FILE_ENVIRONMENT

    ctr = container(rendered)
    path = next(e["value"] for e in ctr["env"] if e["name"] == ZOOKEEPER_AUTH_FILE_ENVIRONMENT)
    mount = next(m for m in ctr["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/"))
    assert mount["readOnly"] is True
    volume = next(v for v in pod_spec(the(rendered, "StatefulSet"))["volumes"] if v["name"] == mount["name"])
    assert not any(o["kind"] == "Secret" and o["metadata"]["name"].startswith("gateway-zookeeper-auth") for o in rendered)
    assert volume["secret"]["secretName"] == "gateway-zookeeper-auth"
    assert volume["secret"]["defaultMode"] == 0o440
    assert ("gateway-zookeeper-auth", Path(path).name) in USER_SECRETS
    identities = set()
    for pod in pod_names(rendered):
        (tmp_path / pod).mkdir()
        cfg, _ = effective_config(rendered, tmp_path / pod, pod)
        assert cfg.ha is not None and cfg.ha.zookeeper_auth, "the pod authenticates to ZooKeeper"
        identities.add(cfg.ha.zookeeper_auth)
    assert len(identities) == 1
