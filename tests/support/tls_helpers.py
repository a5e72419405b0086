"""A broker with TLS listeners and client contexts for it, against the
certificate authority of the ``pki`` fixture; shared by the TLS and the
WebSocket tests."""

from __future__ import annotations

import ssl

from gateway.auth import hash_password
from gateway.transports.tls import TlsSettings


def tls_broker(broker_factory, pki, *, auth=None, **tls):
    settings = TlsSettings(cert=pki["server"], key=pki["server"], **tls)
    return broker_factory(tls=settings, stomp_tls_port=0, mqtt_tls_port=0, admin_tls_port=0, auth=auth)


def client_context(pki, *, certificate=False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki["ca"])
    if certificate:
        context.load_cert_chain(pki["client_cert"], pki["client_key"])
    return context


# A device user (no password it would use) and what the sensors group may do:
# for brokers whose clients log in with a certificate mapped to this user.
SENSOR = {"name": "sensor", "password_hash": hash_password("unused", iterations=1000), "groups": ["sensors"]}
CERT_AUTH = {
    "users": [SENSOR],
    "acl": [{"destination": "/topic/plant.>", "write": ["sensors"], "read": ["sensors"]}],
}
