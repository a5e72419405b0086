"""TLS listeners for STOMP (stomp.py), MQTT (paho-mqtt) and the admin API,
against a certificate authority the tests make with trustme; client
certificates mapped to users; plain listeners turned off; bad handshakes
cost only their own connection."""

from __future__ import annotations

import http.client
import socket
import ssl

import pytest

from gateway.config import ConfigError, load
from gateway.transports.tls import TlsSettings
from tests.support.helpers import RawClient, unique, wait_for
from tests.support.mqtt_helpers import Paho
from tests.support.tls_helpers import CERT_AUTH, client_context, tls_broker


def stomp_tls(stomp_client, broker, pki, *, certificate=False, **headers):
    address = ("127.0.0.1", broker.running.ports["stomp-tls"])
    client = stomp_client(address, connect=False)
    extra = {"cert_file": pki["client_cert"], "key_file": pki["client_key"]} if certificate else {}
    client.conn.set_ssl(for_hosts=[address], ca_certs=pki["ca"], **extra)
    return client.connect(**headers)


def test_stomp_over_tls_meets_plain_stomp_on_one_core(broker_factory, pki, stomp_client):
    broker = tls_broker(broker_factory, pki)
    queue = f"/queue/{unique()}"
    secure = stomp_tls(stomp_client, broker, pki)
    secure.subscribe(queue)
    stomp_client(broker).send(queue, b"from the plain port")
    secure.send(queue, b"from the TLS port")
    assert sorted(secure.wait_messages(2)[i].body for i in range(2)) == [b"from the TLS port", b"from the plain port"]


def test_mqtt_over_tls_with_paho(broker_factory, pki, paho):
    broker = tls_broker(broker_factory, pki)
    port = broker.running.ports["mqtt-tls"]
    topic = f"plant/{unique()}/temp"
    subscriber = Paho(port, unique("sub"), tls=client_context(pki))
    publisher = Paho(port, unique("pub"), tls=client_context(pki))
    try:
        assert subscriber.subscribe((topic, 1)) == [1]
        publisher.publish(topic, b"21.5", qos=1)
        message = subscriber.wait(1)[0]
        assert (message.payload, message.qos) == (b"21.5", 1)
    finally:
        subscriber.close()
        publisher.close()


def test_the_admin_api_over_https(broker_factory, pki):
    broker = tls_broker(broker_factory, pki)
    connection = http.client.HTTPSConnection("127.0.0.1", broker.running.ports["admin-tls"], context=client_context(pki), timeout=5)
    try:
        connection.request("GET", "/healthz")
        assert connection.getresponse().status == 200
    finally:
        connection.close()


def test_a_client_certificate_logs_in_as_its_mapped_user(broker_factory, pki, stomp_client, raw_client):
    broker = tls_broker(
        broker_factory, pki, auth=CERT_AUTH, client_certs="optional", ca=pki["ca"],
        cert_users=[{"subject": "CN=sensor-1", "user": "sensor"}],
    )
    device = stomp_tls(stomp_client, broker, pki, certificate=True)  # no login, no passcode
    device.subscribe("/topic/plant.1.temp")
    device.send("/topic/plant.1.temp", b"20.1")  # the ACL grants it to the sensors group
    assert device.wait_messages(1)[0].body == b"20.1"
    # Without a certificate the same port wants a password, as usual.
    with socket.create_connection(("127.0.0.1", broker.running.ports["stomp-tls"])) as raw:
        with client_context(pki).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"CONNECT\naccept-version:1.2\nhost:h\n\n\x00")
            reply = tls.recv(4096)
    assert reply.startswith(b"ERROR\n") and b"authentication failed" in reply


def test_mqtt_with_a_client_certificate(broker_factory, pki):
    broker = tls_broker(broker_factory, pki, auth=CERT_AUTH, client_certs="required", ca=pki["ca"], cn_as_user=False,
                        cert_users=[{"subject": "CN=sensor-1", "user": "sensor"}])
    device = Paho(broker.running.ports["mqtt-tls"], unique("dev"), tls=client_context(pki, certificate=True))
    try:
        assert device.connacks == [(False, 0)]
        assert device.subscribe(("plant/+/temp", 1), ("elsewhere/#", 1)) == [1, 0x80]
    finally:
        device.close()


def test_required_client_certificates_refuse_a_handshake_without_one(broker_factory, pki, stomp_client):
    broker = tls_broker(broker_factory, pki, client_certs="required", ca=pki["ca"])
    port = broker.running.ports["stomp-tls"]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with client_context(pki).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(b"CONNECT\naccept-version:1.2\nhost:h\n\n\x00")
                if not tls.recv(4096):  # TLS 1.3 reports the refusal on the first read
                    raise ConnectionError("closed")
    assert stomp_tls(stomp_client, broker, pki, certificate=True).conn.is_connected()


def test_plain_listeners_can_be_turned_off(broker_factory, pki):
    broker = tls_broker(broker_factory, pki, plain=False)
    assert sorted(broker.running.ports) == ["admin-tls", "mqtt-tls", "stomp-tls"]


def test_a_client_that_does_not_speak_tls_costs_only_its_connection(broker_factory, pki, stomp_client):
    broker = tls_broker(broker_factory, pki, handshake_timeout_s=0.5)
    address = ("127.0.0.1", broker.running.ports["stomp-tls"])
    plain_talker = RawClient(address)
    silent = RawClient(address)
    try:
        plain_talker.send(b"CONNECT\naccept-version:1.2\n\n\x00")
        plain_talker.wait_closed()
        silent.wait_closed(timeout=5)  # never starts a handshake: cut off after handshake_timeout_s
    finally:
        plain_talker.close()
        silent.close()
    wait_for(lambda: broker.call(lambda: len(broker.running.server.connections)) == 0, what="no connection left")
    assert broker.call(lambda: broker.running.server.tls_handshakes_failed) == 2  # gateway_tls_handshakes_failed_total
    assert stomp_tls(stomp_client, broker, pki).conn.is_connected()


def test_tls_settings_are_checked_at_start(tmp_path, pki):
    config = tmp_path / "gateway.toml"
    config.write_text(f'[tls]\ncert = "{tmp_path / "missing.pem"}"\nkey = "{pki["server"]}"\n')
    with pytest.raises(ConfigError, match="cannot load the certificate"):
        load(str(config))
    config.write_text(f'[tls]\ncert = "{pki["server"]}"\nkey = "{pki["server"]}"\nclient_certs = "required"\n')
    with pytest.raises(ConfigError, match="needs tls.ca"):
        load(str(config))
    config.write_text(f'stomp_tls_port = 0\n[tls]\ncert = "{pki["server"]}"\nkey = "{pki["server"]}"\n')
    assert load(str(config)).tls.enabled


def test_a_rotated_certificate_is_served_to_new_connections_without_a_restart(broker_factory, pki, tmp_path, stomp_client):
    import trustme

    broker = tls_broker(broker_factory, pki, reload_interval_s=0.1)
    port = broker.running.ports["stomp-tls"]
    held = stomp_tls(stomp_client, broker, pki)  # connected with the first certificate
    queue = f"/queue/{unique()}"
    held.subscribe(queue)
    renewed = trustme.CA()  # as if cert-manager renewed it under another issuer
    renewed.cert_pem.write_to_path(tmp_path / "renewed-ca.pem")
    renewed.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(pki["server"])

    def presents_the_renewed_one() -> bool:
        context = ssl.create_default_context(cafile=str(tmp_path / "renewed-ca.pem"))
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                with context.wrap_socket(raw, server_hostname="127.0.0.1"):
                    return True
        except ssl.SSLError:
            return False

    wait_for(presents_the_renewed_one, timeout=10, interval=0.05, what="the renewed certificate")
    held.send(queue, b"the old connection goes on")
    assert held.wait_messages(1)[0].body == b"the old connection goes on"


def _certificate_files(ca, tmp_path, common_name):
    leaf = ca.issue_cert("device.example", common_name=common_name)
    files = {"client_cert": tmp_path / "odd_cert.pem", "client_key": tmp_path / "odd_key.pem"}
    leaf.cert_chain_pems[0].write_to_path(files["client_cert"])
    leaf.private_key_pem.write_to_path(files["client_key"])
    return {name: str(path) for name, path in files.items()}


def _tls_connect_reply(broker, pki, client_files, then=b""):
    """CONNECT (no login) with this client certificate, then ``then``; all the broker answered."""
    context = client_context(pki)
    context.load_cert_chain(client_files["client_cert"], client_files["client_key"])
    with socket.create_connection(("127.0.0.1", broker.running.ports["stomp-tls"]), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"CONNECT\naccept-version:1.2\nhost:h\n\n\x00" + then)
            reply = b""
            while reply.count(b"\x00") < (2 if then else 1):
                data = tls.recv(4096)
                if not data:
                    break
                reply += data
            return reply


@pytest.mark.parametrize("cn_as_user", [False, True])
def test_a_comma_inside_a_certificates_common_name_does_not_make_it_another_subject(
    broker_factory, pki, ca, tmp_path, cn_as_user
):
    # Issued by the trusted CA, with one CN whose value reads like two attributes.
    mallory = _certificate_files(ca, tmp_path, "mallory-dev,CN=sensor-1")
    broker = tls_broker(broker_factory, pki, auth=CERT_AUTH, client_certs="optional", ca=pki["ca"],
                        cn_as_user=cn_as_user, cert_users=[{"subject": "CN=sensor-1", "user": "sensor"}])
    send = b"SEND\ndestination:/topic/plant.1.temp\nreceipt:r1\n\nhot\x00"
    reply = _tls_connect_reply(broker, pki, mallory, then=send)
    if cn_as_user:  # she is who her CN says, whole: a user with no grants, not sensor
        assert reply.startswith(b"CONNECTED\n") and b"ERROR\n" in reply and b"RECEIPT" not in reply
    else:  # no entry names her subject: credentials needed, and she has none
        assert reply.startswith(b"ERROR\n") and b"authentication failed" in reply


def test_a_configured_subject_is_read_with_rfc_4514_escapes(broker_factory, pki, ca, tmp_path):
    smith = _certificate_files(ca, tmp_path, "Smith, J")
    broker = tls_broker(broker_factory, pki, auth=CERT_AUTH, client_certs="optional", ca=pki["ca"],
                        cert_users=[{"subject": "CN=Smith\\, J", "user": "sensor"}])
    assert _tls_connect_reply(broker, pki, smith).startswith(b"CONNECTED\n")


def test_a_cert_users_subject_that_is_not_rfc_4514_is_refused_at_start(pki):
    with pytest.raises(ValueError, match="cert_users"):
        TlsSettings(cert=pki["server"], key=pki["server"], client_certs="optional", ca=pki["ca"],
                    cert_users=[{"subject": "CN=a,", "user": "x"}])
    with pytest.raises(ValueError, match="expected type=value"):  # unescaped, the comma starts an RDN
        TlsSettings(cert=pki["server"], key=pki["server"], client_certs="optional", ca=pki["ca"],
                    cert_users=[{"subject": "CN=Smith, J", "user": "x"}])


def test_a_certificate_named_like_a_group_does_not_get_the_groups_grants(broker_factory, pki, ca, tmp_path):
    # cn_as_user: the CN "sensors" is a user of that name, not the sensors group the ACL grants.
    impostor = _certificate_files(ca, tmp_path, "sensors")
    broker = tls_broker(broker_factory, pki, auth=CERT_AUTH, client_certs="optional", ca=pki["ca"], cn_as_user=True)
    send = b"SEND\ndestination:/topic/plant.1.temp\nreceipt:r1\n\nhot\x00"
    reply = _tls_connect_reply(broker, pki, impostor, then=send)
    assert reply.startswith(b"CONNECTED\n") and b"user 'sensors' may not write" in reply and b"RECEIPT" not in reply
