"""The Dockerfile in deploy/: it installs the project the way CI does (from a
wheel its build stage compiles with mypyc), copies everything that build
needs, and runs the pod's command as a non-root user."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from typing import Any

from tests.support.deploy_helpers import ROOT, container, dockerfile_stages, dockerignore_excludes


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
    build, docker = dockerfile_stages()
    (base,) = docker["FROM"]
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?(@sha256:[0-9a-f]+)?", base)
    assert build["FROM"] == [f"{base} AS build"], "the wheel is built on the image's own base (the same Python ABI)"

    # CI runs `make test`; the Makefile's install rules (the broker's, then the
    # test extras on top) upgrade pip, then pip-install the project (`make
    # fast` adds its compiler later: not part of that install).
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    install_rules = [makefile.split(f"$(BIN)/{stamp}:", 1)[1].split("\n\n", 1)[0] for stamp in (".installed-broker", ".installed")]
    make_installs = [i for rule in install_rules for i in _pip_installs(rule)]
    image_installs = [i for run in docker["RUN"] for i in _pip_installs(run)]
    upgrade = ["--upgrade", "pip"]

    def strip_quiet(args: list[str]) -> list[str]:
        return [a for a in args if a != "--quiet"]

    assert upgrade in [strip_quiet(i) for i in make_installs] and upgrade in image_installs
    projects = [strip_quiet(i) for i in make_installs if strip_quiet(i) != upgrade]
    # CI: `pip install -e .` then `-e '.[test]'`; the image: the same project,
    # no extras, not editable, as the wheel the build stage made of it with the
    # hot path compiled (by the mypy `make fast` pins), and no compiler.
    assert [p[-1] for p in projects] == [".", ".[test]"], projects
    build_runs = " ".join(build["RUN"])
    assert re.search(r"(^|\s)GATEWAY_MYPYC=1 pip wheel --no-build-isolation --no-deps --wheel-dir /wheels \.(\s|$)", build_runs), build_runs
    pinned = re.search(r"^MYPY_VERSION := (\S+)$", makefile, re.MULTILINE)
    assert pinned and f"'mypy=={pinned.group(1)}'" in build_runs, "the image compiles with the mypy `make fast` pins"
    assert ["/wheels/gateway-*.whl"] in image_installs, f"the image installs with {image_installs}"
    assert "--from=build /wheels /wheels" in docker["COPY"]
    assert not any(word in run for run in docker["RUN"] for word in ("apt-get", "gcc", "mypy")), "the toolchain stays in the build stage"

    # Everything the wheel build needs is copied: pyproject, its readme, the
    # build scripts, every package.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    copied = " ".join(build["COPY"])
    needed = ["pyproject.toml", pyproject["project"]["readme"], "setup.py", "build_fast.py"]
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
    probe = next(p["containerPort"] for p in ctr["ports"] if p["name"] == "probe")
    assert f"127.0.0.1:{probe}/healthz" in docker["HEALTHCHECK"][-1], "the image's health check asks the probe port"
    assert "ENTRYPOINT" not in docker
    assert any(c.split()[-1] == "/etc/gateway/gateway.toml" and "deploy/gateway.toml" in c for c in docker["COPY"])


def test_dockerignore_sends_what_the_image_copies_and_nothing_heavy_or_secret() -> None:
    # What comes from the build context (a COPY --from comes from a stage).
    copies = [copy for stage in dockerfile_stages() for copy in stage["COPY"] if not copy.startswith("--from=")]
    sources = [word for copy in copies for word in copy.split()[:-1] if not word.startswith("--")]
    assert sources, "the Dockerfile copies something"
    for source in sources:
        sample = source.rstrip("/") + ("/__init__.py" if source.endswith("/") else "")
        assert not dockerignore_excludes(sample), f"{sample} is copied by the Dockerfile but left out of the context"
    for path in ("core/broker.py", "gateway/admin/api.py", "persistence/journal.py", "gateway/admin/static/console.js"):
        assert not dockerignore_excludes(path), path
    for path in (".venv/bin/python", "data/store/00000001.log", ".git/HEAD", "build/npm/stomp.js", "tests/test_layering.py",
                 "deploy/admin-users.toml", "deploy/client-users.toml", "gateway/__pycache__/app.cpython-311.pyc",
                 "core/broker.cpython-311-x86_64-linux-gnu.so", "gateway.egg-info/PKG-INFO", ".pytest_cache/README.md"):
        assert dockerignore_excludes(path), f"{path} would be sent to the image build"


def test_the_base_image_is_pinned_by_exact_version_and_digest() -> None:
    for stage in dockerfile_stages():
        (base,) = stage["FROM"]
        assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+@sha256:[0-9a-f]{64}( AS \w+)?", base), base
