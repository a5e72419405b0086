"""The replication link's mutual authentication, sans-IO (as
persistence/replica/replication.py, the stream it guards): feed bytes with
:meth:`Handshake.receive_data` (``b""`` is EOF), take what to send with
:meth:`Handshake.data_to_send`; :attr:`Handshake.done` once the peer proved
it holds the group's cluster secret.  No sockets, clocks or logs.

Why a shared secret: one Secret for the whole group, no certificate
authority to run, the way RabbitMQ's Erlang cookie and Artemis's cluster
user/password do it.  It authenticates; it does not encrypt: ``[ha]
link_tls`` puts the link in TLS (certificates both ways), under this
handshake.

Each side sends a Challenge at once (its role, a fresh random nonce, its
node id); the backup then sends its Proof, the primary checks it and only
then sends its own.  A Proof is HMAC-SHA256 under the secret over a label,
the prover's role, both nonces and both node ids, so a proof is good for one
connection, one direction and one pair of names: a recorded one fails
against a fresh nonce, one reflected back fails on the role, and a nonce sent
back as the peer's own is refused.  Nothing of the replication stream is
read or sent before :attr:`done` (the bytes that came after the handshake
are :meth:`leftover`).

Message on the wire: ``u8 length`` of what follows (the type and the body), ``u8 type``, the body.
Every message is small, so the whole handshake is bounded by
:data:`MAX_BUFFERED` bytes (and the caller bounds it in time).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct

LABEL = b"gateway replication link v1"
NONCE_BYTES = 32
MAC_BYTES = hashlib.sha256().digest_size
MAGIC = b"GWRL"
MAX_NODE_ID_BYTES = 64
# Both messages a peer sends, with their headers, fit in this; more is refused.
MAX_BUFFERED = 2 * (2 + len(MAGIC) + 1 + NONCE_BYTES + 1 + MAX_NODE_ID_BYTES) + 2 * (2 + MAC_BYTES)

CHALLENGE = 1
PROOF = 2
ROLES = {b"P": "primary", b"B": "backup"}
_CODES = {name: code for code, name in ROLES.items()}
_HEAD = struct.Struct("<BB")


class AuthenticationError(Exception):
    """The peer is not a member (or broke the handshake): ``reason`` says how."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def proof(secret: bytes, prover: str, backup_nonce: bytes, primary_nonce: bytes, backup_id: str,
          primary_id: str) -> bytes:
    """What ``prover`` ("primary" or "backup") sends: HMAC-SHA256 under the
    secret over every value of this connection, each length-prefixed."""
    parts = (LABEL, prover.encode(), backup_nonce, primary_nonce, backup_id.encode(), primary_id.encode())
    return hmac.new(secret, b"".join(struct.pack("<H", len(p)) + p for p in parts), hashlib.sha256).digest()


def _message(kind: int, body: bytes) -> bytes:
    return _HEAD.pack(1 + len(body), kind) + body


class Handshake:
    """One side's handshake: ``role`` is this side's ("primary" or "backup")."""

    def __init__(self, role: str, node_id: str, secret: bytes, *, nonce: bytes | None = None) -> None:
        if role not in _CODES:
            raise ValueError(f"role must be primary or backup, not {role!r}")
        encoded = node_id.encode()
        if not encoded or len(encoded) > MAX_NODE_ID_BYTES:
            raise ValueError("node id must be 1-64 bytes")
        self.role = role
        self.node_id = node_id
        self._secret = secret
        self.nonce = secrets.token_bytes(NONCE_BYTES) if nonce is None else nonce
        self.peer_id: str | None = None
        self.peer_nonce: bytes | None = None
        self.done = False
        self.their_eof = False
        self._buf = bytearray()
        self._received = 0
        self._out = bytearray(_message(CHALLENGE, MAGIC + _CODES[role] + self.nonce + bytes([len(encoded)]) + encoded))
        self._error: AuthenticationError | None = None

    def data_to_send(self) -> bytes:
        out, self._out = bytes(self._out), bytearray()
        return out

    @property
    def buffered(self) -> int:
        """Bytes held from the peer, not yet a whole message."""
        return len(self._buf)

    def leftover(self) -> bytes:
        """Bytes that came after the handshake: the replication stream's."""
        out, self._buf = bytes(self._buf), bytearray()
        return out

    def receive_data(self, data: bytes) -> None:
        """Take the peer's bytes and go as far as they allow; raises
        :class:`AuthenticationError` (and again on every later call)."""
        if self._error is not None:
            raise self._error
        try:
            self._receive(data)
        except AuthenticationError as exc:
            self._error = exc
            raise

    def _receive(self, data: bytes) -> None:
        if not data:
            self.their_eof = True
        elif not self.done:
            # Neither side sends past its part before the other's answer, so
            # more than both messages can hold is a flood, refused unbuffered.
            self._received += len(data)
            if self._received > MAX_BUFFERED:
                raise AuthenticationError(f"more than {MAX_BUFFERED} bytes in the handshake")
            self._buf += data
        else:
            self._buf += data
            return
        while not self.done:
            message = self._next()
            if message is None:
                break
            kind, body = message
            if self.peer_nonce is None:
                self._challenge(kind, body)
            else:
                self._proof(kind, body)
        if not self.done and self.their_eof:
            raise AuthenticationError("the peer closed the connection during the handshake")

    def _next(self) -> tuple[int, bytes] | None:
        if len(self._buf) < 1:
            return None
        length = self._buf[0]
        if length == 0:
            raise AuthenticationError("a handshake message without a type")
        if len(self._buf) < 1 + length:
            return None
        kind, body = self._buf[1], bytes(self._buf[2 : 1 + length])
        del self._buf[: 1 + length]
        return kind, body

    def _challenge(self, kind: int, body: bytes) -> None:
        if kind != CHALLENGE:
            raise AuthenticationError("not a replication peer: its first message is not a challenge")
        if body[: len(MAGIC)] != MAGIC:
            raise AuthenticationError("not a replication peer: no handshake (an older node or another protocol)")
        fixed = len(MAGIC) + 1 + NONCE_BYTES + 1
        if len(body) < fixed or len(body) != fixed + body[fixed - 1]:
            raise AuthenticationError("a challenge of the wrong size")
        role = ROLES.get(body[len(MAGIC) : len(MAGIC) + 1])
        if role is None or role == self.role:
            raise AuthenticationError(f"the peer says it is a {role or 'stranger'}; a {self.role} expects the other role")
        nonce = body[len(MAGIC) + 1 : len(MAGIC) + 1 + NONCE_BYTES]
        if hmac.compare_digest(nonce, self.nonce):
            raise AuthenticationError("the peer sent back our own nonce")
        try:
            peer_id = body[fixed:].decode()
        except UnicodeDecodeError:
            raise AuthenticationError("the peer's node id is not UTF-8") from None
        if not peer_id:
            raise AuthenticationError("the peer's node id is empty")
        self.peer_nonce, self.peer_id = nonce, peer_id
        if self.role == "backup":  # the backup proves first: the primary proves nothing to a stranger
            self._send_proof()

    def _proof(self, kind: int, body: bytes) -> None:
        if kind != PROOF or len(body) != MAC_BYTES:
            raise AuthenticationError("expected a proof")
        peer = "primary" if self.role == "backup" else "backup"
        if not hmac.compare_digest(body, self._mac(peer)):
            raise AuthenticationError("wrong proof: the peer does not hold this group's cluster secret")
        if self.role == "primary":
            self._send_proof()
        self.done = True

    def _mac(self, prover: str) -> bytes:
        assert self.peer_nonce is not None and self.peer_id is not None
        if self.role == "backup":
            return proof(self._secret, prover, self.nonce, self.peer_nonce, self.node_id, self.peer_id)
        return proof(self._secret, prover, self.peer_nonce, self.nonce, self.peer_id, self.node_id)

    def _send_proof(self) -> None:
        self._out += _message(PROOF, self._mac(self.role))
