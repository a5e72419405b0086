"""pyproject.toml says what the package is; this adds only the optional compiled build.

Pure Python by default (every install CI and `make run` do). With
``GATEWAY_MYPYC=1`` the wheel also carries the hot path compiled with mypyc
(build_fast.py names the modules), beside the .py files: what deploy/Dockerfile's
build stage makes, with mypy installed and ``pip wheel --no-build-isolation``."""

import os
import sys

from setuptools import setup

if os.environ.get("GATEWAY_MYPYC") == "1":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from build_fast import ext_modules

    setup(ext_modules=ext_modules())
else:
    setup()
