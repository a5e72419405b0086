"""The compiled hot path: which modules mypyc compiles, and the one way they are built.

Two builds use it and must not drift apart:

* `make fast` runs this file: extension modules next to their .py files, in
  place, which the same imports then load (`make unfast` removes them);
* `GATEWAY_MYPYC=1 pip wheel --no-build-isolation .` (setup.py) puts the same
  extensions into the wheel, as deploy/Dockerfile's build stage does, so the
  image runs compiled.

One group, whose shared library sits inside the gateway package
(gateway/_fast__mypyc.*.so), so the compiled modules load wherever gateway does
(an editable install, PYTHONPATH, site-packages), not only from this directory.
The .py files stay the source and the fallback: nothing imports this at run time.

    python build_fast.py           compile in place (needs mypy, the version the Makefile pins)
    python build_fast.py --list    the modules, one line (the Makefile reads it)
"""

from __future__ import annotations

import sys
from typing import Any

# The sans-IO hot path: the STOMP codec and session, the session skeleton, the
# core's routing, the store's journal, index and records, the MQTT codec with
# its in- and outgoing halves. Nothing that imports trio is compiled.
# gateway/mqtt/codec/wire.py stays out (mypyc cannot compile its str subclass), and
# the MQTT session and properties with it.
FAST_MODULES = [
    "core/broker.py", "core/buffers.py", "core/clients.py", "core/destinations.py", "core/matching.py",
    "core/messages.py", "core/names.py", "core/registry.py", "core/subscriptions.py",
    "gateway/session/flow.py", "gateway/session/outbox.py", "gateway/session/skeleton.py",
    "gateway/stomp/codec.py", "gateway/stomp/delivery.py", "gateway/stomp/frames.py",
    "gateway/stomp/headers.py", "gateway/stomp/session.py",
    "persistence/index.py", "persistence/journal.py", "persistence/records.py", "persistence/store.py",
    "gateway/mqtt/codec/connection.py", "gateway/mqtt/codec/decoders.py", "gateway/mqtt/codec/encoders.py",
    "gateway/mqtt/codec/packets.py",
    "gateway/mqtt/topics.py", "gateway/mqtt/inflight.py", "gateway/mqtt/outgoing.py", "gateway/mqtt/incoming.py",
]  # fmt: skip


def ext_modules() -> list[Any]:
    """The extensions, for setuptools' ``ext_modules`` (imports mypyc: a build-time need only)."""
    from mypyc.build import mypycify

    # Only these modules must type-check; what they import is read, not judged.
    return list(mypycify(["--follow-imports=silent", *FAST_MODULES], group_name="gateway._fast"))


if __name__ == "__main__":
    if sys.argv[1:] == ["--list"]:
        print(" ".join(FAST_MODULES))
    else:
        from setuptools import setup

        setup(name="gateway-fast", ext_modules=ext_modules(), script_args=["build_ext", "--inplace"])
