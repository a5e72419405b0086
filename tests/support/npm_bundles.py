"""The browser WebSocket clients the tests drive (stomp.js, MQTT.js), fetched
from the npm registry at pinned versions.

The CI machine need not have node or npm: this downloads each pinned tarball
from registry.npmjs.org, checks it against the registry's pinned sha512
``integrity`` before reading anything from it, and unpacks only the one
browser bundle the tests load into ``build/npm/`` (ignored by git).  Run it as
a script (``make test`` does) or call :func:`bundle` from a test.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import sys
import tarfile
import urllib.request
from pathlib import Path

CACHE = Path(__file__).resolve().parents[2] / "build" / "npm"
REGISTRY = "https://registry.npmjs.org"
# Tarballs are a few hundred KiB; anything far larger is not what we pinned.
MAX_TARBALL_BYTES = 16 * 1024 * 1024
DOWNLOAD_TIMEOUT_S = 60


@dataclasses.dataclass(frozen=True)
class Bundle:
    package: str
    version: str
    integrity: str  # the registry's dist.integrity for this version
    member: str  # the browser bundle inside the tarball (under package/)

    @property
    def url(self) -> str:
        return f"{REGISTRY}/{self.package}/-/{self.package.rsplit('/', 1)[-1]}-{self.version}.tgz"

    @property
    def path(self) -> Path:
        return CACHE / f"{self.package.replace('/', '__')}-{self.version}" / Path(self.member).name


BUNDLES = {
    # The UMD bundle defines the global StompJs.
    "stompjs": Bundle("@stomp/stompjs", "7.5.0",
                      "sha512-xh3sdzEYH8M+krQGBOgj+U0BLBHd7ccTj8YM3mVxaULMTW/wx2QBWf448pilRiWZKjglhDmNILxM3W+j/Ch9uw==",
                      "bundles/stomp.umd.min.js"),
    # The browser build defines the global mqtt.
    "mqtt": Bundle("mqtt", "5.16.0",
                   "sha512-G0VsEtuJz5sJUgZJaaADMVfW7SIFPzkIuHR+d6rk+tBeSwdCfd9BaIRycRfd2AbyFDEmLlFM+SDQeti/+IbOnw==",
                   "dist/mqtt.min.js"),
}


class BundleError(Exception):
    """The bundle could not be fetched or did not match its pin."""


def verify(data: bytes, integrity: str) -> None:
    algorithm, _, expected = integrity.partition("-")
    if algorithm != "sha512":
        raise BundleError(f"unsupported integrity algorithm {algorithm!r}")
    actual = base64.b64encode(hashlib.sha512(data).digest()).decode()
    if actual != expected:
        raise BundleError(f"sha512 mismatch: expected {expected}, got {actual}")


def extract(data: bytes, member: str) -> bytes:
    """The one file ``package/<member>`` of an npm tarball."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        try:
            info = tar.getmember(f"package/{member}")
        except KeyError:
            raise BundleError(f"package/{member} is not in the tarball") from None
        if not info.isfile():
            raise BundleError(f"package/{member} is not a regular file")
        handle = tar.extractfile(info)
        assert handle is not None
        return handle.read()


def bundle(name: str) -> Path:
    """The local path of a pinned browser bundle, fetched once."""
    spec = BUNDLES[name]
    if spec.path.exists():
        return spec.path
    try:
        with urllib.request.urlopen(spec.url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            data = response.read(MAX_TARBALL_BYTES + 1)
    except OSError as exc:
        raise BundleError(f"{spec.url}: {exc}") from exc
    if len(data) > MAX_TARBALL_BYTES:
        raise BundleError(f"{spec.url}: larger than {MAX_TARBALL_BYTES} bytes")
    verify(data, spec.integrity)
    content = extract(data, spec.member)
    spec.path.parent.mkdir(parents=True, exist_ok=True)
    partial = spec.path.with_suffix(".part")
    partial.write_bytes(content)
    partial.replace(spec.path)  # never a half-written bundle under the final name
    return spec.path


def main() -> int:
    failed = 0
    for name in BUNDLES:
        try:
            print(f"{name}: {bundle(name)}")
        except BundleError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
