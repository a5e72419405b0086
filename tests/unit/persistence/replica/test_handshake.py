"""The replication link's handshake (persistence/replica/handshake.py), sans-IO: two
sides back to back, with the right and a wrong secret, replayed and
reflected messages, cut and oversized input."""

from __future__ import annotations

import pytest

from persistence.replica import handshake as h

SECRET = b"a shared secret of the group 0123"


def run(primary: h.Handshake, backup: h.Handshake) -> None:
    """Exchange bytes until neither side has anything more to send."""
    while True:
        to_primary, to_backup = backup.data_to_send(), primary.data_to_send()
        if not to_primary and not to_backup:
            return
        if to_primary:
            primary.receive_data(to_primary)
        if to_backup:
            backup.receive_data(to_backup)


def test_the_same_secret_authenticates_both_ways() -> None:
    primary, backup = h.Handshake("primary", "gw-0", SECRET), h.Handshake("backup", "gw-1", SECRET)
    run(primary, backup)
    assert primary.done and backup.done
    assert primary.peer_id == "gw-1" and backup.peer_id == "gw-0"
    assert primary.leftover() == backup.leftover() == b""


def test_a_backup_with_a_wrong_secret_is_refused_and_learns_no_proof_of_the_primary() -> None:
    primary, backup = h.Handshake("primary", "gw-0", SECRET), h.Handshake("backup", "rogue", b"guessed secret 0000")
    backup.receive_data(primary.data_to_send())
    with pytest.raises(h.AuthenticationError, match="cluster secret"):
        primary.receive_data(backup.data_to_send())
    assert not primary.done
    # The primary proves nothing to a peer that did not prove itself first.
    assert primary.data_to_send() == b""
    with pytest.raises(h.AuthenticationError):  # and stays refused
        primary.receive_data(b"\x00")


def test_a_backup_refuses_a_primary_with_a_wrong_secret() -> None:
    impostor, backup = h.Handshake("primary", "gw-0", b"not the group's secret"), h.Handshake("backup", "gw-1", SECRET)
    # The impostor answers as a real primary would, but under its own key.
    impostor.receive_data(backup.data_to_send())
    backup.receive_data(impostor.data_to_send())
    with pytest.raises(h.AuthenticationError):
        impostor.receive_data(backup.data_to_send())  # it cannot check the backup's proof either
    forged = h.proof(b"not the group's secret", "primary", backup.nonce, impostor.nonce, "gw-1", "gw-0")
    with pytest.raises(h.AuthenticationError, match="cluster secret"):
        backup.receive_data(bytes([1 + len(forged), h.PROOF]) + forged)
    assert not backup.done


def test_a_recorded_proof_fails_against_a_fresh_nonce() -> None:
    first_primary, first_backup = h.Handshake("primary", "gw-0", SECRET), h.Handshake("backup", "gw-1", SECRET)
    recorded_challenge = first_backup.data_to_send()
    first_primary.receive_data(recorded_challenge)
    first_backup.receive_data(first_primary.data_to_send())
    recorded_proof = first_backup.data_to_send()
    first_primary.receive_data(recorded_proof)
    assert first_primary.done  # the original conversation was good
    # Replayed word for word to a new connection (whose nonce is new): refused.
    second = h.Handshake("primary", "gw-0", SECRET)
    second.receive_data(recorded_challenge)
    with pytest.raises(h.AuthenticationError, match="cluster secret"):
        second.receive_data(recorded_proof)
    assert not second.done


def test_a_peer_that_sends_back_our_nonce_is_refused() -> None:
    primary = h.Handshake("primary", "gw-0", SECRET)
    ours = primary.data_to_send()
    mirrored = h.Handshake("backup", "gw-1", SECRET, nonce=primary.nonce).data_to_send()
    with pytest.raises(h.AuthenticationError, match="our own nonce"):
        primary.receive_data(mirrored)
    # Our own challenge reflected whole says the wrong role.
    with pytest.raises(h.AuthenticationError, match="other role"):
        h.Handshake("primary", "gw-0", SECRET).receive_data(ours)


def test_the_proof_of_one_role_is_not_the_other_s() -> None:
    """A primary's proof, reflected to it as a backup's, is not a backup's proof."""
    nonce_b, nonce_p = b"b" * 32, b"p" * 32
    assert h.proof(SECRET, "primary", nonce_b, nonce_p, "b", "p") != h.proof(SECRET, "backup", nonce_b, nonce_p, "b", "p")
    assert h.proof(SECRET, "backup", nonce_b, nonce_p, "b", "p") != h.proof(SECRET, "backup", nonce_b, nonce_p, "c", "p")


@pytest.mark.parametrize("cut", [1, 5, 20, 40])
def test_a_handshake_cut_short_is_refused(cut: int) -> None:
    primary, backup = h.Handshake("primary", "gw-0", SECRET), h.Handshake("backup", "gw-1", SECRET)
    challenge = backup.data_to_send()
    primary.receive_data(challenge[:cut])
    assert not primary.done
    with pytest.raises(h.AuthenticationError, match="closed"):
        primary.receive_data(b"")


def test_bytes_arriving_one_at_a_time_still_authenticate() -> None:
    primary, backup = h.Handshake("primary", "gw-0", SECRET), h.Handshake("backup", "gw-1", SECRET)
    for byte in backup.data_to_send():
        primary.receive_data(bytes([byte]))
    for byte in primary.data_to_send():
        backup.receive_data(bytes([byte]))
    for byte in backup.data_to_send():
        primary.receive_data(bytes([byte]))
    backup.receive_data(primary.data_to_send())
    assert primary.done and backup.done


def test_oversized_or_foreign_input_is_refused_without_buffering_it() -> None:
    with pytest.raises(h.AuthenticationError, match="not a replication peer"):
        h.Handshake("primary", "gw-0", SECRET).receive_data(b"\x10\x01GET / HTTP/1.1\r\n")
    # A stream's Hello frame (the old protocol, no handshake) is not a challenge.
    with pytest.raises(h.AuthenticationError):
        h.Handshake("primary", "gw-0", SECRET).receive_data(b"\x20\x00\x00\x00" + b"\x00" * 40)
    # A flood in one read: refused as it comes, never kept.
    shake = h.Handshake("primary", "gw-0", SECRET)
    with pytest.raises(h.AuthenticationError, match="bytes in the handshake"):
        shake.receive_data(b"\x05\x01" + b"x" * (h.MAX_BUFFERED + 1))
    assert shake.buffered == 0
    # A good challenge, then more than a proof can be: refused at the bound.
    primary, backup = h.Handshake("primary", "gw-0", SECRET), h.Handshake("backup", "gw-1", SECRET)
    primary.receive_data(backup.data_to_send())
    with pytest.raises(h.AuthenticationError, match="bytes in the handshake"):
        for _ in range(h.MAX_BUFFERED):
            primary.receive_data(b"\xff")
    assert primary.buffered <= h.MAX_BUFFERED


def test_bytes_after_the_handshake_are_the_stream_s() -> None:
    primary, backup = h.Handshake("primary", "gw-0", SECRET), h.Handshake("backup", "gw-1", SECRET)
    primary.receive_data(backup.data_to_send())
    backup.receive_data(primary.data_to_send())
    primary.receive_data(backup.data_to_send() + b"STREAM")
    assert primary.done and primary.leftover() == b"STREAM"
