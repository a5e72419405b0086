"""The Kubernetes deployment in deploy/ as the deploy tests see it: the
kustomization rendered (with ``kubectl kustomize`` when kubectl is on the PATH,
else with the small renderer below, which knows exactly the kustomize features
deploy/ uses and refuses any other), lookups into the rendered objects, the
config the pod's broker would run with, and the Dockerfile's instructions."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from gateway import __main__ as cli
from gateway import config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
GATEWAY = str(Path(sys.executable).parent / "gateway")


# -- rendering ---------------------------------------------------------------


def _hash_suffix(obj: dict[str, Any]) -> str:
    """kustomize's content hash for a generated ConfigMap or Secret (api/hasher)."""
    # kustomize (v5) hashes with an empty name: the suffix depends on the content alone.
    fields: dict[str, Any] = {"kind": obj["kind"], "name": "", "data": obj.get("data", {})}
    if obj["kind"] == "Secret":
        fields["type"] = obj.get("type", "Opaque")
    # Go's json.Marshal: sorted keys, no spaces, <, > and & escaped, non-ASCII kept.
    encoded = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for char, escape in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        encoded = encoded.replace(char, escape)
    digest = hashlib.sha256(encoded.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans({"0": "g", "1": "h", "3": "k", "a": "m", "e": "t"}))


def _kyaml_base64(text: str) -> str:
    """Base64 as kustomize writes it: in 70-column lines, each ending in a newline, once longer than one."""
    encoded = base64.b64encode(text.encode()).decode()
    if len(encoded) < 70:
        return encoded
    return "".join(encoded[i : i + 70] + "\n" for i in range(0, len(encoded), 70))


def _generated(kind: str, spec: dict[str, Any], base: Path) -> dict[str, Any]:
    unknown = set(spec) - {"name", "files", "type"}
    assert not unknown, f"the test's renderer does not know {kind} generator fields {unknown}: extend it"
    data = {}
    for item in spec.get("files", []):
        key, _, path = item.rpartition("=")
        key = key or Path(path).name
        content = (base / path).read_text()
        data[key] = _kyaml_base64(content) if kind == "Secret" else content
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": kind, "metadata": {"name": spec["name"]}, "data": data}
    if kind == "Secret":
        obj["type"] = spec.get("type", "Opaque")
    return obj


def pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    return obj.get("spec", {}).get("template", {}).get("spec")


def _add_labels(obj: dict[str, Any], pairs: dict[str, str], selectors: bool, templates: bool) -> None:
    obj["metadata"].setdefault("labels", {}).update(pairs)
    spec = obj.get("spec", {})
    if selectors:
        if obj["kind"] == "Service" and "selector" in spec:
            spec["selector"].update(pairs)
        elif "selector" in spec:  # workloads and PodDisruptionBudgets
            spec["selector"].setdefault("matchLabels", {}).update(pairs)
        if obj["kind"] == "NetworkPolicy":  # its own pods, and its peers chosen by pod labels
            if "podSelector" in spec:
                spec["podSelector"].setdefault("matchLabels", {}).update(pairs)
            for rule, peers in (("ingress", "from"), ("egress", "to")):
                for peer in (p for r in spec.get(rule, []) for p in r.get(peers, [])):
                    # Not created where absent: a peer chosen by matchExpressions keeps only those.
                    if "matchLabels" in peer.get("podSelector", {}):
                        peer["podSelector"]["matchLabels"].update(pairs)
        # kustomize's selector field specs also reach a pod template's (anti-)affinity terms.
        affinity = spec.get("template", {}).get("spec", {}).get("affinity", {})
        for kind in ("podAffinity", "podAntiAffinity"):
            terms = affinity.get(kind, {})
            required = terms.get("requiredDuringSchedulingIgnoredDuringExecution", [])
            preferred = [t["podAffinityTerm"] for t in terms.get("preferredDuringSchedulingIgnoredDuringExecution", [])]
            for term in required + preferred:
                if "labelSelector" in term:
                    term["labelSelector"].setdefault("matchLabels", {}).update(pairs)
    if selectors or templates:
        if "template" in spec:
            spec["template"].setdefault("metadata", {}).setdefault("labels", {}).update(pairs)
        for claim in spec.get("volumeClaimTemplates", []):
            claim.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)


def _set_image(pod: dict[str, Any], rule: dict[str, str]) -> None:
    for container in pod.get("initContainers", []) + pod.get("containers", []):
        name = re.split(r"[@]|:(?=[^/]*$)", container["image"])[0]
        if name == rule["name"]:
            container["image"] = rule.get("newName", name) + (f":{rule['newTag']}" if "newTag" in rule else "")


def _rename_references(pod: dict[str, Any], names: dict[tuple[str, str], str]) -> None:
    def renamed(kind: str, name: str) -> str:
        return names.get((kind, name), name)

    for volume in pod.get("volumes", []):
        if "configMap" in volume:
            volume["configMap"]["name"] = renamed("ConfigMap", volume["configMap"]["name"])
        if "secret" in volume:
            volume["secret"]["secretName"] = renamed("Secret", volume["secret"]["secretName"])
    for container in pod.get("initContainers", []) + pod.get("containers", []):
        for env in container.get("env", []):
            source = env.get("valueFrom", {})
            if "configMapKeyRef" in source:
                source["configMapKeyRef"]["name"] = renamed("ConfigMap", source["configMapKeyRef"]["name"])
            if "secretKeyRef" in source:
                source["secretKeyRef"]["name"] = renamed("Secret", source["secretKeyRef"]["name"])
        for env_from in container.get("envFrom", []):
            if "configMapRef" in env_from:
                env_from["configMapRef"]["name"] = renamed("ConfigMap", env_from["configMapRef"]["name"])
            if "secretRef" in env_from:
                env_from["secretRef"]["name"] = renamed("Secret", env_from["secretRef"]["name"])


def render_python(base: Path = DEPLOY) -> list[dict[str, Any]]:
    """``kubectl kustomize`` for the features deploy/kustomization.yaml uses, and no others."""
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    known = {"apiVersion", "kind", "resources", "labels", "images", "configMapGenerator", "secretGenerator", "namespace"}
    assert not set(kustomization) - known, f"the test's renderer does not know {set(kustomization) - known}: extend it"
    objects: list[dict[str, Any]] = []
    for resource in kustomization.get("resources", []):
        assert (base / resource).is_file(), f"{resource}: the renderer handles files, not bases or URLs"
        objects += [doc for doc in yaml.safe_load_all((base / resource).read_text()) if doc]
    names: dict[tuple[str, str], str] = {}
    for key, kind in (("configMapGenerator", "ConfigMap"), ("secretGenerator", "Secret")):
        for spec in kustomization.get(key, []):
            obj = _generated(kind, spec, base)
            hashed = f"{spec['name']}-{_hash_suffix(obj)}"
            names[(kind, spec["name"])] = hashed
            obj["metadata"]["name"] = hashed
            objects.append(obj)
    for entry in kustomization.get("labels", []):
        assert not set(entry) - {"pairs", "includeSelectors", "includeTemplates"}, entry
        for obj in objects:
            _add_labels(obj, entry["pairs"], entry.get("includeSelectors", False), entry.get("includeTemplates", False))
    for obj in objects:
        if "namespace" in kustomization:
            obj["metadata"]["namespace"] = kustomization["namespace"]
        pod = pod_spec(obj)
        if pod is not None:
            _rename_references(pod, names)
            for rule in kustomization.get("images", []):
                _set_image(pod, rule)
    return objects


def render_kubectl(base: Path = DEPLOY) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None
    out = subprocess.run([kubectl, "kustomize", str(base)], capture_output=True, text=True, timeout=60, check=True)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def the(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = pod_spec(the(objects, "StatefulSet"))["containers"]
    assert len(containers) == 1
    return containers[0]


def port_number(ctr: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in ctr["ports"] if p["name"] == port)


def pod_names(objects: list[dict[str, Any]]) -> list[str]:
    """The StatefulSet's pods: <name>-0 .. <name>-(replicas-1)."""
    sts = the(objects, "StatefulSet")
    return [f"{sts['metadata']['name']}-{i}" for i in range(sts["spec"]["replicas"])]


# The Secrets deploy/README.md has the user create before applying (not in
# the kustomization: a secret shipped in the repository would be everyone's),
# as the test's kubelet finds them: (name, key) -> value.
USER_SECRETS = {
    ("gateway-cluster-secret", "secret"): "deploy-test-cluster-secret-0f3b9a2c7d",
    ("gateway-zookeeper-auth", "auth"): "gateway:deploy-test-zookeeper-password-5e1d93",
}


def pod_environment(objects: list[dict[str, Any]], pod: str) -> dict[str, str]:
    """The container's environment in pod ``pod``, as the kubelet makes it:
    downward-API fields, keys of the Secrets the user created (USER_SECRETS),
    and $(VAR) in values expanded from the variables defined before (an
    unknown one left as written, $$ an escaped $)."""
    env: dict[str, str] = {}
    for entry in container(objects)["env"]:
        if "secretKeyRef" in entry.get("valueFrom", {}):
            ref = entry["valueFrom"]["secretKeyRef"]
            assert (ref["name"], ref["key"]) in USER_SECRETS, f"the kubelet would not start: no Secret {ref['name']}"
            env[entry["name"]] = USER_SECRETS[ref["name"], ref["key"]]
        elif "valueFrom" in entry:
            field = entry["valueFrom"]["fieldRef"]["fieldPath"]
            assert field == "metadata.name", f"the test's kubelet does not know the field {field}: extend it"
            env[entry["name"]] = pod
        else:
            env[entry["name"]] = re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                        lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), entry.get("value", ""))
    return env


def generated_secret(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The Secret ``name`` as secretGenerator made it (its name with a hash suffix)."""
    found = [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"].rsplit("-", 1)[0] == name]
    assert len(found) == 1, f"expected one Secret {name}-<hash>, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def mount_secrets(objects: list[dict[str, Any]], env: dict[str, str], where: Path) -> dict[str, str]:
    """What the kubelet does with the container's Secret volumes, under
    ``where``: each Secret's keys (generated, or the user's: USER_SECRETS) written as files, and ``env``'s paths into
    their mount points pointed at those files instead."""
    pod = pod_spec(the(objects, "StatefulSet"))
    volumes = {v["name"]: v for v in pod["volumes"]}
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    env = dict(env)
    for mount in container(objects)["volumeMounts"]:
        volume = volumes.get(mount["name"], {})
        if "secret" not in volume:
            continue
        folder = where / mount["name"]
        folder.mkdir(parents=True, exist_ok=True)
        name = volume["secret"]["secretName"]
        if name in secrets:  # generated by kustomization.yaml
            data = {key: base64.b64decode(encoded) for key, encoded in secrets[name]["data"].items()}
        else:  # one the user creates (deploy/README.md, "Apply")
            data = {key: value.encode() for (secret, key), value in USER_SECRETS.items() if secret == name}
            assert data, f"the kubelet would not start: no Secret {name}"
        for key, value in data.items():
            (folder / key).write_bytes(value)
        prefix = mount["mountPath"].rstrip("/") + "/"
        for name, value in env.items():
            if value.startswith(prefix):
                env[name] = str(folder / value[len(prefix):])
    return env


def effective_config(objects: list[dict[str, Any]], tmp_path: Path, pod: str | None = None) -> tuple[config.Config, Any]:
    """The config pod ``pod`` (the first by default) would run with: the
    ConfigMap's file at the --config path plus the flags and the pod's
    environment (its Secrets' files where it names them), through the real
    CLI parser and loader."""
    ctr = container(objects)
    args = cli.parser().parse_args(ctr["args"])
    cm = the(objects, "ConfigMap")
    path = tmp_path / "gateway.toml"
    path.write_text(cm["data"][Path(args.config).name])
    overrides = {k: getattr(args, k) for k in ("bind", "stomp_port", "mqtt_port", "admin_port", "data_dir", "log_format", "log_level")}
    env = mount_secrets(objects, pod_environment(objects, pod or pod_names(objects)[0]), tmp_path / "secrets")
    return config.load(str(path), overrides, env), args


# -- the Dockerfile -----------------------------------------------------------


def dockerfile_stages() -> list[dict[str, list[str]]]:
    """Each build stage's instructions, in order: a stage starts at its FROM."""
    text = (DEPLOY / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)  # line continuations
    stages: list[dict[str, list[str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            stages.append({})
        assert stages, "a Dockerfile starts with FROM"
        stages[-1].setdefault(word.upper(), []).append(rest.strip())
    return stages


def dockerfile_instructions() -> dict[str, list[str]]:
    """The image's own stage, the last: what the pod runs."""
    return dockerfile_stages()[-1]


def dockerignore_excludes(path: str) -> bool:
    """Whether the build context leaves ``path`` out under .dockerignore, by
    Docker's rules: patterns in order, the last that matches the path or one
    of its parent folders wins, "!" lets back in; "*" and "?" stay within
    one path segment, "**" spans any number of them."""
    excluded = False
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/")
        regex = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        parts = path.split("/")
        if any(re.fullmatch(regex, "/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            excluded = not negate
    return excluded
