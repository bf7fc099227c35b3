"""Signed checkpoints: Ed25519 signatures over the chain head (docs/FORMAT.md, "Signed
checkpoints"; docs/SECURITY.md says what they prove).

A writer opened with ``signing_key=`` signs its chain head in every seal and in a
``checkpoint`` control batch written after the first batch at least ``sign_interval``
seconds after the last checkpoint. :class:`Checkpoints` is that writer's end;
:class:`Verifier` checks what it wrote with the public key alone. Both need the
``cryptography`` package (``pip install 'persistlog[audit]'``): without it they raise
:class:`MissingDependencyError`. The private key never leaves the :class:`Signer`: no repr,
message or record holds it.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

from .._errors import missing_cryptography
from . import encoder
from . import constants as F

#: Seconds between checkpoints of a writer that keeps writing (``open(sign_interval=)``).
SIGN_INTERVAL = 60.0
KEY_ID_BYTES = 8


def _ed25519() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise missing_cryptography("signed checkpoints", "audit") from None
    return ed25519


def key_id(public_raw: bytes) -> str:
    """The name of a public key in checkpoints: the first 8 bytes of its SHA-256, in hex."""
    return hashlib.sha256(public_raw).digest()[:KEY_ID_BYTES].hex()


def _raw_public(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    raw: bytes = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return raw


def load_private_key(key: Any) -> Any:
    """An ``Ed25519PrivateKey`` from one, from PEM (PKCS#8, unencrypted) bytes, or from a
    path to such a file."""
    ed25519 = _ed25519()
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key
    from cryptography.hazmat.primitives import serialization

    if isinstance(key, (str, os.PathLike)):
        with open(key, "rb") as f:
            key = f.read()
    if isinstance(key, bytes):
        try:
            loaded = serialization.load_pem_private_key(key, password=None)
        except (ValueError, TypeError) as e:
            raise ValueError(f"signing_key is not an unencrypted PEM private key: {type(e).__name__}") from None
        if isinstance(loaded, ed25519.Ed25519PrivateKey):
            return loaded
    raise TypeError("signing_key must be an Ed25519 private key, PEM bytes of one, or the path of a PEM file")


def load_public_key(data: bytes) -> Any:
    """An ``Ed25519PublicKey`` from PEM (SubjectPublicKeyInfo) bytes or 32 raw bytes."""
    ed25519 = _ed25519()
    from cryptography.hazmat.primitives import serialization

    if len(data) == 32:
        return ed25519.Ed25519PublicKey.from_public_bytes(data)
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        raise ValueError("not a PEM public key nor 32 raw bytes of an Ed25519 public key") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise ValueError(f"not an Ed25519 public key ({type(key).__name__})")
    return key


class Signer:
    """Signs chain heads with one Ed25519 private key; knows its key id, shows nothing else."""

    __slots__ = ("_key", "key_id")

    def __init__(self, key: Any) -> None:
        self._key = load_private_key(key)
        self.key_id = key_id(_raw_public(self._key.public_key()))

    def fields(self, seq: int, lsn: int, head: bytes) -> dict[str, Any]:
        """The keys a signed record carries: the key id and the signature."""
        return {"key": self.key_id, "sig": self._key.sign(encoder.checkpoint_message(seq, lsn, head))}

    def __repr__(self) -> str:
        return f"Signer(key_id={self.key_id!r})"


class Checkpoints:
    """A writer's signed checkpoints: what to add to a seal, and when a checkpoint is due."""

    __slots__ = ("signer", "interval", "_last")

    def __init__(self, signer: Signer | None, interval: float) -> None:
        self.signer = signer
        self.interval = interval
        self._last = time.monotonic()

    def seal_fields(self, seq: int, next_lsn: int, head: bytes | None) -> dict[str, Any]:
        """What a seal of log ``seq`` ending at ``next_lsn`` and ``head`` adds: a signature
        (nothing without a key or a chain)."""
        if self.signer is None or head is None:
            return {}
        return self.signer.fields(seq, next_lsn, head)

    def due(self, seq: int, lsn: int, head: bytes | None) -> bytes | None:
        """A checkpoint batch of log ``seq`` at the LSN due ``lsn`` linking to ``head``,
        when ``interval`` seconds passed since the last one; None otherwise. Asked after
        each batch but a checkpoint."""
        if self.signer is None or head is None or time.monotonic() - self._last < self.interval:
            return None
        self._last = time.monotonic()
        record = {"t": F.CONTROL_CHECKPOINT, "seq": seq, "lsn": lsn, "head": head, **self.signer.fields(seq, lsn, head)}
        return encoder.control_batch([record], lsn, time.time_ns() // 1000, head)


class Verifier:
    """Checks signed records with the public keys given: a writer's key, and the keys it
    signed with before (a writer whose ``signing_key`` was replaced signs its older logs'
    checkpoints with the old key). Each signed record names its key id; a record signed
    with a key not given does not verify."""

    def __init__(self, *public_keys: Any) -> None:
        if not public_keys:
            raise ValueError("a Verifier needs at least one public key")
        self._ed25519 = _ed25519()
        self._keys: dict[str, Any] = {}
        for public_key in public_keys:
            if isinstance(public_key, bytes):
                public_key = load_public_key(public_key)
            self._keys[key_id(_raw_public(public_key))] = public_key
        #: The ids of the keys given, in the order given.
        self.key_ids = tuple(self._keys)

    def check(self, record: dict[str, Any], seq: int, lsn: int, head: bytes) -> str | None:
        """Why ``record`` (a checkpoint or seal of log ``seq`` at ``lsn``, whose chain head
        is ``head`` by the links) is not a valid signature of that position; None if it is."""
        from cryptography.exceptions import InvalidSignature

        sig, key = record.get("sig"), record.get("key")
        if not isinstance(sig, bytes) or len(sig) != F.SIGNATURE_SIZE:
            return "no signature"
        public_key = self._keys.get(key) if isinstance(key, str) else None
        if public_key is None:
            given = ", ".join(self.key_ids)
            return f"signed with key {key!r}, not with the public key{'s' if len(self.key_ids) > 1 else ''} given ({given})"
        try:
            public_key.verify(sig, encoder.checkpoint_message(seq, lsn, head))
        except InvalidSignature:
            return "the signature does not verify with the public key (the record or what it signs was changed)"
        return None
