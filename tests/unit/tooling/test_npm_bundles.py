"""The pinned-bundle fetcher's checks, offline: a tarball that does not match
its sha512 pin is refused, and only the named bundle is taken out of it."""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile

import pytest

from tests.support.npm_bundles import BUNDLES, BundleError, extract, verify


def tarball(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def test_a_matching_tarball_passes_and_a_changed_one_is_refused():
    data = tarball({"package/dist/x.js": b"ok"})
    verify(data, integrity(data))
    with pytest.raises(BundleError, match="sha512 mismatch"):
        verify(data + b"\0", integrity(data))
    with pytest.raises(BundleError, match="unsupported"):
        verify(data, "sha1-" + integrity(data)[7:])


def test_only_the_named_regular_file_is_extracted():
    data = tarball({"package/dist/x.js": b"bundle", "package/../../evil": b"no"})
    assert extract(data, "dist/x.js") == b"bundle"
    with pytest.raises(BundleError, match="not in the tarball"):
        extract(data, "dist/missing.js")


def test_the_pins_are_sha512_of_the_registrys_tarballs():
    for spec in BUNDLES.values():
        assert spec.integrity.startswith("sha512-") and len(base64.b64decode(spec.integrity[7:])) == 64
    # The registry's dist.tarball for each pinned version.
    assert BUNDLES["stompjs"].url == "https://registry.npmjs.org/@stomp/stompjs/-/stompjs-7.5.0.tgz"
    assert BUNDLES["mqtt"].url == "https://registry.npmjs.org/mqtt/-/mqtt-5.16.0.tgz"
