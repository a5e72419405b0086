"""The Dockerfile in deploy/: it installs the project the way CI does, copies
everything that install needs, and runs the pod's command as a non-root user."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from typing import Any

from tests.deploy_helpers import ROOT, container, dockerfile_instructions


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

    # CI runs `make test`; the Makefile's install rule upgrades pip, then pip-installs
    # the project (`make fast` adds its compiler later: not part of that install).
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    install_rule = (ROOT / "Makefile").read_text().split("$(BIN)/.installed:", 1)[1].split("\n\n", 1)[0]
    make_installs = _pip_installs(install_rule)
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
