"""TLS for every listener: one server context from the configured certificate
and key, optional client certificates verified against a CA and mapped to
users.  Only configuration and certificate reading live here; the server
wraps its listeners with the context."""

from __future__ import annotations

import dataclasses
import os
import ssl
from typing import Any

CLIENT_CERTS = ("none", "optional", "required")


@dataclasses.dataclass(frozen=True)
class TlsSettings:
    cert: str = ""  # PEM certificate chain; TLS listeners start only when set
    key: str = ""  # PEM private key (may be the cert file itself)
    # Client certificates: "optional" verifies one when offered, "required"
    # refuses a handshake without one; both need `ca`.
    client_certs: str = "none"
    ca: str = ""
    # Certificate subject -> user: [{subject = "CN=sensor-1", user = "sensors"}].
    # `subject` is a whole RFC 4514 subject ("CN=sensor-1,O=Plant") or one
    # attribute of it ("CN=sensor-1"); a comma inside a value is escaped
    # ("CN=Smith\\, J").  With `cn_as_user`, a certificate no
    # entry names logs in as the user its common name names.
    cert_users: list[dict[str, str]] = dataclasses.field(default_factory=list)
    cn_as_user: bool = False
    # false: only the TLS listeners run (the plain STOMP, MQTT and admin ports stay closed).
    plain: bool = True
    handshake_timeout_s: float = 10.0
    # How often the certificate, key and CA files are checked for a change
    # (a rotated Kubernetes Secret, cert-manager); a changed set is loaded for
    # new connections without a restart.  0: never.
    reload_interval_s: float = 60.0

    def __post_init__(self) -> None:
        if self.client_certs not in CLIENT_CERTS:
            raise ValueError(f"tls.client_certs must be one of {', '.join(CLIENT_CERTS)}, not {self.client_certs!r}")
        if self.client_certs != "none" and not self.ca:
            raise ValueError("tls.client_certs needs tls.ca, the authority client certificates are checked against")
        if bool(self.cert) != bool(self.key):
            raise ValueError("tls.cert and tls.key go together")
        if not self.plain and not self.cert:
            raise ValueError("tls.plain = false needs tls.cert and tls.key: no listener would be left")
        for entry in self.cert_users:
            if not isinstance(entry, dict) or not entry.get("subject") or not entry.get("user"):
                raise ValueError("tls.cert_users entries need a subject and a user")
            try:
                parse_subject(entry["subject"])
            except (ValueError, UnicodeDecodeError) as exc:
                raise ValueError(f"tls.cert_users: {exc}") from None

    @property
    def enabled(self) -> bool:
        return bool(self.cert)


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """The listeners' context; a missing or unreadable file raises ValueError naming it."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    load_files(context, settings)
    context.verify_mode = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}[
        settings.client_certs
    ]
    return context


def link_contexts(settings: TlsSettings) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The HA replication link's (server, client) contexts from the same
    files: each end shows ``cert`` and requires the other's, verified against
    ``ca`` (the backup checks the primary's name against its advertise host).
    A missing or unreadable file raises ValueError naming it."""
    if not settings.cert or not settings.ca:
        raise ValueError("ha.link_tls needs tls.cert, tls.key and tls.ca (each end shows its certificate and "
                         "verifies the other's against the CA)")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    for context in (server, client):
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(settings.cert, settings.key)
            context.load_verify_locations(cafile=settings.ca)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"tls: cannot load the certificate, key or CA for the replication link: {exc}") from None
    server.verify_mode = ssl.CERT_REQUIRED
    return server, client


def load_files(context: ssl.SSLContext, settings: TlsSettings) -> None:
    """(Re)load the certificate, key and CA into ``context``: handshakes that
    start afterwards use them, established connections keep theirs."""
    try:
        context.load_cert_chain(settings.cert, settings.key)
        if settings.client_certs != "none":
            context.load_verify_locations(cafile=settings.ca)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"tls: cannot load the certificate, key or CA: {exc}") from None


def files_version(settings: TlsSettings) -> tuple[tuple[int, int], ...]:
    """What changes when a file is replaced: (mtime, size) of each file (a
    Secret update swaps a symlink, which changes both on the path)."""
    paths = [settings.cert, settings.key] + ([settings.ca] if settings.client_certs != "none" else [])
    out = []
    for path in paths:
        try:
            status = os.stat(path)
        except OSError:
            out.append((-1, -1))
        else:
            out.append((status.st_mtime_ns, status.st_size))
    return tuple(out)


# A subject as data: its RDNs in the certificate's order (most general
# first, as getpeercert() gives them), each a set of (short type, value).
Rdn = frozenset[tuple[str, str]]


def subject_rdns(certificate: dict[str, Any]) -> tuple[Rdn, ...]:
    """A peer certificate's subject, parsed: never text to be split again, so
    a value holding ``,`` or ``+`` (``CN=mallory-dev,CN=sensor-1`` in one
    attribute) stays one value."""
    return tuple(
        frozenset((_type(name), value) for name, value in rdn) for rdn in certificate.get("subject", ())
    )


def parse_subject(text: str) -> tuple[Rdn, ...]:
    """An RFC 4514 string (``CN=a\\,b,O=Plant``: most specific first, ``\\``
    escapes a special character or two hex digits, ``+`` joins the
    attributes of one RDN) as :func:`subject_rdns` gives a certificate's."""
    rdns: list[list[tuple[str, str]]] = [[]]
    name: str | None = None
    current = bytearray()
    i = 0

    def finish() -> None:
        if name is None or not name.strip():
            raise ValueError(f"subject {text!r}: expected type=value at character {i}")
        value = current.decode("utf-8").lstrip(" ")  # "CN=a, O=b" is forgiven
        if not value:
            raise ValueError(f"subject {text!r}: {name.strip()} has no value")
        rdns[-1].append((_type(name.strip()), value))

    while i < len(text):
        char = text[i]
        if char == "\\":
            pair = text[i + 1 : i + 3]
            if len(pair) == 2 and all(c in "0123456789abcdefABCDEF" for c in pair):
                current.append(int(pair, 16))
                i += 3
                continue
            if i + 1 >= len(text):
                raise ValueError(f"subject {text!r} ends in a lone backslash")
            current += text[i + 1].encode()
            i += 2
            continue
        if char == "=" and name is None:
            name, current = current.decode(), bytearray()
        elif char in ",+":
            finish()
            if char == ",":
                rdns.append([])
            name, current = None, bytearray()
        else:
            current += char.encode()
        i += 1
    finish()
    return tuple(frozenset(rdn) for rdn in reversed(rdns))


def _type(name: str) -> str:
    return _SHORT.get(name, name).upper()


_SHORT = {
    "commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
    "stateOrProvinceName": "ST", "localityName": "L", "domainComponent": "DC", "userId": "UID",
}


class CertificateUsers:
    """Maps a verified client certificate to a user name (or None).

    A configured subject of one attribute (``CN=sensor-1``) matches a
    certificate with exactly that attribute value; a longer one must equal
    the whole subject, RDN by RDN.  Both are compared as parsed attributes,
    so escaping in the config and commas inside a certificate's values mean
    what RFC 4514 says."""

    def __init__(self, settings: TlsSettings) -> None:
        self.whole: dict[tuple[Rdn, ...], str] = {}
        self.attribute: dict[tuple[str, str], str] = {}
        for entry in settings.cert_users:
            subject = parse_subject(entry["subject"])
            if len(subject) == 1 and len(subject[0]) == 1:
                (only,) = subject[0]
                self.attribute[only] = entry["user"]
            else:
                self.whole[subject] = entry["user"]
        self.cn_as_user = settings.cn_as_user

    def user(self, certificate: dict[str, Any] | None) -> str | None:
        if not certificate:
            return None
        subject = subject_rdns(certificate)
        if subject in self.whole:
            return self.whole[subject]
        attributes = [attribute for rdn in reversed(subject) for attribute in rdn]
        for attribute in attributes:  # most specific first
            if attribute in self.attribute:
                return self.attribute[attribute]
        if self.cn_as_user:
            names = [value for kind, value in attributes if kind == "CN"]
            # Two common names: which one is the user is anyone's guess, so neither.
            return names[0] if len(names) == 1 else None
        return None
