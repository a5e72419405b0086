"""The Kubernetes deployment in deploy/, checked without a cluster.

The kustomization is rendered (with ``kubectl kustomize`` when kubectl is on
the PATH, else with the small renderer below, which knows exactly the
kustomize features deploy/ uses and refuses any other), every object is
validated offline against the Kubernetes OpenAPI schemas in strict mode
(``kubernetes-validate``), and the pod spec is held against the real program:
the command line parses with the real CLI, the ConfigMap's file loads with the
real config loader, the ports, paths and grace period agree with what that
config says, the Dockerfile installs the project the way CI does and runs the
same command, and finally the real broker is started with the ConfigMap's file
(loopback, port 0 through the same flags) and its probe paths are requested.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway import __main__ as cli
from gateway import config
from tests.helpers import wait_for

kubernetes_validate = pytest.importorskip("kubernetes_validate")  # the test extra installs it

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
GATEWAY = str(Path(sys.executable).parent / "gateway")
# Oldest Kubernetes minor the manifests are meant for, and the newest the
# validator knows: every object must be valid for both.
K8S_VERSIONS = ("1.27.0", kubernetes_validate.utils.latest_version())
COMMON_LABELS = {"app.kubernetes.io/name": "gateway", "app.kubernetes.io/component": "broker"}
# Flush window plus closing the store (last fdatasync): what the kubelet must wait beyond shutdown_grace_s.
STORE_CLOSE_MARGIN_S = 5.0


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


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    return obj.get("spec", {}).get("template", {}).get("spec")


def _add_labels(obj: dict[str, Any], pairs: dict[str, str], selectors: bool, templates: bool) -> None:
    obj["metadata"].setdefault("labels", {}).update(pairs)
    spec = obj.get("spec", {})
    if selectors:
        if obj["kind"] == "Service" and "selector" in spec:
            spec["selector"].update(pairs)
        elif "selector" in spec:  # workloads and PodDisruptionBudgets
            spec["selector"].setdefault("matchLabels", {}).update(pairs)
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
        pod = _pod_spec(obj)
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


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return render_kubectl() if shutil.which("kubectl") else render_python()


def the(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = _pod_spec(the(objects, "StatefulSet"))["containers"]
    assert len(containers) == 1
    return containers[0]


def port_number(ctr: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in ctr["ports"] if p["name"] == port)


def effective_config(objects: list[dict[str, Any]], tmp_path: Path) -> tuple[config.Config, Any]:
    """The config the pod's broker would run with: the ConfigMap's file at the
    --config path plus the flags, through the real CLI parser and loader."""
    ctr = container(objects)
    args = cli._parser().parse_args(ctr["args"])
    cm = the(objects, "ConfigMap")
    path = tmp_path / "gateway.toml"
    path.write_text(cm["data"][Path(args.config).name])
    overrides = {k: getattr(args, k) for k in ("bind", "stomp_port", "mqtt_port", "admin_port", "data_dir", "log_format", "log_level")}
    return config.load(str(path), overrides), args


# -- what gets rendered ------------------------------------------------------


def test_kustomization_renders_the_expected_objects(rendered: list[dict[str, Any]]) -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"].rsplit("-", 1)[0] if o["kind"] in ("ConfigMap", "Secret") else o["metadata"]["name"]) for o in rendered)
    assert kinds == [
        ("ConfigMap", "gateway-config"),
        ("PodDisruptionBudget", "gateway"),
        ("Secret", "gateway-admin-users"),
        ("Service", "gateway"),
        ("Service", "gateway-headless"),
        ("StatefulSet", "gateway"),
    ]
    for obj in rendered:
        assert COMMON_LABELS.items() <= obj["metadata"]["labels"].items(), obj["metadata"]["name"]
        assert "namespace" not in obj["metadata"], "the base leaves the namespace to kubectl -n or an overlay"


def test_python_renderer_matches_kubectl() -> None:
    """The fallback renderer (used where kubectl is missing) gives kubectl's output."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: the comparison needs it")

    def keyed(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
        return {(obj["kind"], obj["metadata"]["name"]): obj for obj in objects}

    assert keyed(render_python()) == keyed(render_kubectl())


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_is_valid_in_strict_mode(rendered: list[dict[str, Any]], version: str) -> None:
    for obj in rendered:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{obj['kind']}/{obj['metadata']['name']} is invalid for Kubernetes {version}: {exc.caught}") from None


def test_the_validator_refuses_what_an_api_server_would(rendered: list[dict[str, Any]]) -> None:
    """Strict mode really is strict: a misspelt field and a wrong type fail."""
    bad = copy.deepcopy(the(rendered, "StatefulSet"))
    _pod_spec(bad)["terminationGracePeriod"] = 30
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[-1], strict=True)
    bad = copy.deepcopy(the(rendered, "Service", "gateway"))
    bad["spec"]["ports"][0]["port"] = "61613"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[-1], strict=True)


# -- the pod against the program ----------------------------------------------


def test_container_runs_the_documented_command(rendered: list[dict[str, Any]]) -> None:
    ctr = container(rendered)
    assert ctr["command"] == ["gateway"]
    assert ctr["args"][0] == "serve"
    args = cli._parser().parse_args(ctr["args"])  # exits (fails) on an unknown flag
    assert args.command == "serve"
    assert (args.bind, args.data_dir, args.log_format) == ("0.0.0.0", "/data", "json")
    assert args.config == "/etc/gateway/gateway.toml"
    help_text = subprocess.run([GATEWAY, "serve", "--help"], capture_output=True, text=True, timeout=30, check=True).stdout
    for flag in (a for a in ctr["args"] if a.startswith("--")):
        assert flag in help_text, f"{flag} is not in `gateway serve --help`"
    assert ctr["image"].startswith("gateway:"), "the images: entry gives the tag"


def test_configmap_file_loads_and_agrees_with_the_pod(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    sts = the(rendered, "StatefulSet")
    pod = _pod_spec(sts)
    ctr = container(rendered)
    cfg, args = effective_config(rendered, tmp_path)
    # The file alone (without the flags) loads too, and says the same thing.
    alone = config.load(str(tmp_path / "gateway.toml"))
    assert (alone.bind, alone.data_dir, alone.log_format) == (cfg.bind, cfg.data_dir, cfg.log_format)

    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    assert ports == {"stomp": cfg.stomp_port, "mqtt": cfg.mqtt_port, "admin": cfg.admin_port}
    assert ports == {"stomp": 61613, "mqtt": 1883, "admin": 8161}

    mounts = {m["name"]: m for m in ctr["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    # --config is the ConfigMap's key, mounted read-only.
    config_mount = next(m for m in ctr["volumeMounts"] if args.config.startswith(m["mountPath"].rstrip("/") + "/"))
    assert config_mount["readOnly"] is True
    assert volumes[config_mount["name"]]["configMap"]["name"] == the(rendered, "ConfigMap")["metadata"]["name"]
    # The data folder is the claim from volumeClaimTemplates.
    assert mounts["data"]["mountPath"] == cfg.data_dir
    assert [c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]] == ["data"]
    assert "data" not in volumes
    # The admin users file is the Secret's key, named by the variable the broker reads.
    env = {e["name"]: e["value"] for e in ctr["env"]}
    users_env = "GATEWAY_ADMIN_USERS_FILE"
    try:
        from gateway.admin.api import USERS_FILE_ENV
    except ImportError:
        pass
    else:
        assert USERS_FILE_ENV == users_env
    users_path = env[users_env]
    secret_mount = next(m for m in ctr["volumeMounts"] if users_path.startswith(m["mountPath"].rstrip("/") + "/"))
    assert secret_mount["readOnly"] is True
    secret = the(rendered, "Secret")
    assert volumes[secret_mount["name"]]["secret"]["secretName"] == secret["metadata"]["name"]
    assert Path(users_path).name in secret["data"]
    # The kubelet waits for the whole drain before SIGKILL.
    assert pod["terminationGracePeriodSeconds"] >= cfg.shutdown_grace_s + STORE_CLOSE_MARGIN_S
    # Service links would put GATEWAY_* variables (from the Service "gateway") in the environment.
    assert pod["enableServiceLinks"] is False


def test_probes_hit_the_admin_port(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    ctr = container(rendered)
    cfg, _ = effective_config(rendered, tmp_path)
    expected = {"readinessProbe": "/readyz", "livenessProbe": "/healthz", "startupProbe": "/healthz"}
    for probe, path in expected.items():
        get = ctr[probe]["httpGet"]
        assert get["path"] == path, probe
        assert port_number(ctr, get["port"]) == cfg.admin_port, probe
    startup = ctr["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60, "store recovery gets at least a minute"


def _quantity(value: str | int) -> float:
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value))
    assert match, value
    return float(match[1]) * units.get(match[2], 1) if match[2] else float(match[1])


def test_security_context_and_resources(rendered: list[dict[str, Any]]) -> None:
    pod = _pod_spec(the(rendered, "StatefulSet"))
    ctr = container(rendered)
    psc, csc = pod["securityContext"], ctr["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0 and psc["fsGroup"] > 0
    assert csc["runAsNonRoot"] is True
    assert csc["readOnlyRootFilesystem"] is True
    assert csc["allowPrivilegeEscalation"] is False
    assert csc["capabilities"]["drop"] == ["ALL"] and "add" not in csc["capabilities"]
    assert psc["seccompProfile"]["type"] == "RuntimeDefault"
    # A read-only root needs a writable /tmp.
    tmp_mount = next(m for m in ctr["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp_mount["name"])
    # The image's USER is the uid the pod runs as.
    user = dockerfile_instructions()["USER"][-1].split(":")
    assert int(user[0]) == psc["runAsUser"] == csc.get("runAsUser", psc["runAsUser"])
    resources = ctr["resources"]
    for kind in ("cpu", "memory"):
        request, limit = _quantity(resources["requests"][kind]), _quantity(resources["limits"][kind])
        assert 0 < request <= limit, kind


def test_services_pdb_and_statefulset_fit_together(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    sts = the(rendered, "StatefulSet")
    template_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["replicas"] == 1, "the store has one writer"
    assert sts["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
    cfg, _ = effective_config(rendered, tmp_path)
    ctr = container(rendered)

    service = the(rendered, "Service", "gateway")
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert service["spec"]["selector"].items() <= template_labels.items()
    exposed = {p["name"]: (p["port"], port_number(ctr, p["targetPort"])) for p in service["spec"]["ports"]}
    assert exposed == {"stomp": (61613, cfg.stomp_port), "mqtt": (1883, cfg.mqtt_port), "admin": (8161, cfg.admin_port)}
    notes = service["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert int(notes["prometheus.io/port"]) == cfg.admin_port
    assert notes["prometheus.io/path"] == "/metrics"

    headless = the(rendered, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"].items() <= template_labels.items()

    pdb = the(rendered, "PodDisruptionBudget")
    assert pdb["spec"].get("maxUnavailable") == 0 or pdb["spec"].get("minAvailable") == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= template_labels.items()


def test_admin_users_secret_is_a_placeholder_that_admits_nobody(rendered: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = the(rendered, "Secret")
    text = base64.b64decode(secret["data"]["users.toml"]).decode()
    assert "REPLACE" in text and "gateway passwd" in text, "the placeholder tells operators what to do"
    users = tomllib.loads(text)["users"]
    assert users and all({"name", "password_hash", "role"} <= set(u) for u in users)
    from gateway import auth
    from gateway.admin import api as adminapi
    path = tmp_path / "users.toml"
    path.write_text(text)
    monkeypatch.setenv(adminapi.USERS_FILE_ENV, str(path))
    cfg, _ = effective_config(rendered, tmp_path)
    loaded = adminapi.load_users(cfg.admin)
    assert set(loaded) == {u["name"] for u in users}
    for name, (hashed, _) in loaded.items():
        for guess in ("", "admin", "password", "changeme", name, "REPLACE-ME"):
            assert not auth.verify_password(guess, hashed), f"the placeholder admits {name}:{guess!r}"


# -- the Dockerfile -----------------------------------------------------------


def dockerfile_instructions() -> dict[str, list[str]]:
    text = (DEPLOY / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)  # line continuations
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.setdefault(word.upper(), []).append(rest.strip())
    return out


def _pip_installs(command: str) -> list[list[str]]:
    """Every ``pip install ...`` in a shell command line, as argument lists."""
    found = []
    lines = [line for line in command.splitlines() if "pip install" in line]
    for part in (p for line in lines for p in re.split(r"&&|;", line)):
        words = shlex.split(part.replace("$(BIN)/", ""))
        words = [w.rsplit("/", 1)[-1] if w.endswith("pip") else w for w in words]
        if words[:2] == ["pip", "install"]:
            found.append(words[2:])
    return found


def test_dockerfile_installs_like_ci_and_runs_the_pod_command(rendered: list[dict[str, Any]]) -> None:
    docker = dockerfile_instructions()
    assert len(docker["FROM"]) == 1 and re.fullmatch(r"python:3\.11-slim(-\w+)?(@sha256:[0-9a-f]+)?", docker["FROM"][0])

    # CI runs `make test`; the Makefile upgrades pip, then pip-installs the project.
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    make_installs = _pip_installs(makefile)
    image_installs = [i for run in docker["RUN"] for i in _pip_installs(run)]
    upgrade = ["--upgrade", "pip"]

    def strip_quiet(args: list[str]) -> list[str]:
        return [a for a in args if a != "--quiet"]

    assert upgrade in [strip_quiet(i) for i in make_installs] and upgrade in image_installs
    (project,) = [strip_quiet(i) for i in make_installs if strip_quiet(i) != upgrade]
    # CI: `pip install -e '.[test]'`; the image: the same project, no extras, not editable.
    assert project[-1].split("[")[0] == "."
    assert ["."] in image_installs, f"the image installs with {image_installs}"

    # Everything `pip install .` needs is copied: pyproject, its readme, every package.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    copied = " ".join(docker["COPY"])
    needed = ["pyproject.toml", pyproject["project"]["readme"]]
    needed += [p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]]
    for name in needed:
        assert re.search(rf"(^|\s){re.escape(name)}/?(\s|$)", copied), f"the Dockerfile does not copy {name}"

    user = docker["USER"][-1].split(":")[0]
    assert user.isdigit() and int(user) != 0, "a numeric non-root USER (runAsNonRoot can check it)"
    assert json.loads(docker["VOLUME"][-1]) == ["/data"]
    exposed = sorted(int(p.split("/")[0]) for p in docker["EXPOSE"][-1].split())
    assert exposed == sorted(p["containerPort"] for p in container(rendered)["ports"])
    ctr = container(rendered)
    assert json.loads(docker["CMD"][-1]) == ctr["command"] + ctr["args"]
    assert "ENTRYPOINT" not in docker
    assert any(c.split()[-1] == "/etc/gateway/gateway.toml" and "deploy/gateway.toml" in c for c in docker["COPY"])


# -- the real broker with the ConfigMap's file --------------------------------


def _get(url: str, auth: tuple[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def test_broker_with_the_configmap_answers_the_probes(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    from gateway.admin.api import USERS_FILE_ENV
    from gateway.auth import hash_password

    ctr = container(rendered)
    pod = _pod_spec(the(rendered, "StatefulSet"))
    cm = the(rendered, "ConfigMap")
    conf = tmp_path / "gateway.toml"
    conf.write_text(cm["data"]["gateway.toml"])
    # The Secret's users plus a read-only user for the scrape, as README says to add.
    users = tomllib.loads(base64.b64decode(the(rendered, "Secret")["data"]["users.toml"]).decode())["users"]
    users.append({"name": "prometheus", "password_hash": hash_password("scrape-me", iterations=1000), "role": "read"})
    users_file = tmp_path / "users.toml"
    users_file.write_text("users = [\n" + "".join(
        f'  {{ name = "{u["name"]}", password_hash = "{u["password_hash"]}", role = "{u["role"]}" }},\n' for u in users
    ) + "]\n")

    # The pod's own arguments, with loopback and port 0 where the pod has 0.0.0.0 and fixed ports.
    args = list(ctr["args"])
    args[args.index("--config") + 1] = str(conf)
    args[args.index("--bind") + 1] = "127.0.0.1"
    args[args.index("--data-dir") + 1] = str(tmp_path / "data")
    args += ["--stomp-port", "0", "--mqtt-port", "0", "--admin-port", "0"]
    env = {**os.environ, **{e["name"]: e["value"] for e in ctr["env"]}, USERS_FILE_ENV: str(users_file)}
    proc = subprocess.Popen([GATEWAY, *args], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []  # the JSON log (--log-format json goes to stderr), read by a thread so no wait blocks
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()

    def events() -> list[dict[str, Any]]:
        return [json.loads(line) for line in list(lines)]

    try:
        def started() -> dict[str, int] | None:
            if proc.poll() is not None:
                reader.join(timeout=5)
                raise AssertionError(f"gateway exited with {proc.returncode}: {''.join(lines)}")
            return next((e["ports"] for e in events() if e.get("event") == "broker_started"), None)

        ports = wait_for(started, timeout=20, interval=0.02, what="broker_started in the JSON log")
        admin = f"http://127.0.0.1:{ports['admin']}"
        assert _get(admin + ctr["livenessProbe"]["httpGet"]["path"])[0] == 200
        assert wait_for(lambda: _get(admin + ctr["readinessProbe"]["httpGet"]["path"])[0] == 200, timeout=10, what="ready")
        assert _get(admin + ctr["startupProbe"]["httpGet"]["path"])[0] == 200
        # The scrape path of the annotations needs credentials; the placeholder admits nobody.
        path = the(rendered, "Service", "gateway")["metadata"]["annotations"]["prometheus.io/path"]
        assert _get(admin + path)[0] == 401
        assert _get(admin + path, ("admin", "admin"))[0] == 401
        status, body = _get(admin + path, ("prometheus", "scrape-me"))
        assert status == 200 and "# TYPE" in body

        # SIGTERM, as the kubelet sends it: a clean exit well within the grace period.
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=pod["terminationGracePeriodSeconds"]) == 0, "".join(lines)
        reader.join(timeout=5)
        names = [e.get("event") for e in events()]
        assert "shutdown_requested" in names and names[-1] == "broker_stopped", names
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        reader.join(timeout=5)
        proc.stderr.close()
