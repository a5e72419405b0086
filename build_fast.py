"""`make fast`: compile the modules FAST_MODULES names (Makefile) with mypyc, in place.

One group, whose shared library sits inside the gateway package
(gateway/_fast__mypyc.*.so), so the compiled modules load wherever gateway
does (an editable install, PYTHONPATH), not only from this directory."""

import os

from mypyc.build import mypycify
from setuptools import setup

setup(
    name="gateway-fast",
    # Only these modules must type-check; what they import is read, not judged.
    ext_modules=mypycify(["--follow-imports=silent", *os.environ["FAST_MODULES"].split()], group_name="gateway._fast"),
    script_args=["build_ext", "--inplace"],
)
