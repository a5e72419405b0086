"""The Kubernetes deployment in deploy/, checked without a cluster: the
kustomization renders the expected objects (the fallback renderer agrees with
kubectl), and every object is validated offline against the Kubernetes OpenAPI
schemas in strict mode (``kubernetes-validate``)."""

from __future__ import annotations

import copy
import shutil
from typing import Any

import pytest

from tests.support.deploy_helpers import pod_spec, render_kubectl, render_python, the

kubernetes_validate = pytest.importorskip("kubernetes_validate")  # the test extra installs it

# Oldest Kubernetes minor the manifests are meant for, and the newest the
# validator knows: every object must be valid for both.
K8S_VERSIONS = ("1.27.0", kubernetes_validate.utils.latest_version())
COMMON_LABELS = {"app.kubernetes.io/name": "gateway", "app.kubernetes.io/component": "broker"}


def test_kustomization_renders_the_expected_objects(rendered: list[dict[str, Any]]) -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"].rsplit("-", 1)[0] if o["kind"] in ("ConfigMap", "Secret") else o["metadata"]["name"]) for o in rendered)
    assert kinds == [
        ("ConfigMap", "gateway-config"),
        ("NetworkPolicy", "gateway"),
        ("PodDisruptionBudget", "gateway"),
        ("Secret", "gateway-admin-users"),
        ("Secret", "gateway-client-users"),
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
    pod_spec(bad)["terminationGracePeriod"] = 30
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[-1], strict=True)
    bad = copy.deepcopy(the(rendered, "Service", "gateway"))
    bad["spec"]["ports"][0]["port"] = "61613"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[-1], strict=True)
