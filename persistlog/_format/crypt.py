"""Encryption at rest (docs/FORMAT.md, "Encrypted batches"; docs/SECURITY.md).

The app supplies its keys through a *key provider*: a callable ``key_id -> bytes`` that
returns the 32-byte AES-256 key of that id (or raises ``KeyError``, or returns None, for an
id it does not know). A writer seals every record batch under the key of the id it writes
with; a reader opens each batch under the key of the id the batch names, so old logs stay
readable after the app moves to a new key id as long as the provider still knows the old one.

:class:`Keyring` is the reading and writing end: it asks the provider once per key id and
keeps the cipher, never the key in any repr, message or log line. Control batches (header,
complete, seal, checkpoint, fence) stay in clear: writers and planners find a log's end,
chain head and snapshot marker without a key.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from .._errors import KeyUnavailableError, missing_cryptography
from . import constants as F

#: A key provider: the 32-byte key of a key id (KeyError or None: not known).
KeyProvider = Callable[[str], Any]


class Opaque(Exception):
    """Raised by :data:`OPAQUE`'s open: the scan looks at the structure only."""


def _aesgcm() -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise missing_cryptography("encrypted logs", "crypto") from None
    return AESGCM


def key_check(key: bytes) -> bytes:
    """What a batch stores to tell a wrong key from damage: 8 bytes of an HMAC of a fixed
    string under the key (nothing about the key can be learnt from it)."""
    return hmac.new(key, F.KEY_CHECK_DOMAIN, hashlib.sha256).digest()[: F.KEY_CHECK_SIZE]


def check_key_id(key_id: object) -> bytes:
    """``key_id`` as the bytes a batch stores; ValueError/TypeError for one that cannot be."""
    if not isinstance(key_id, str):
        raise TypeError(f"a key id is a str, not {type(key_id).__name__}")
    raw = key_id.encode("utf-8")
    if not 1 <= len(raw) <= F.KEY_ID_MAX_BYTES:
        raise ValueError(f"a key id is 1 to {F.KEY_ID_MAX_BYTES} UTF-8 bytes, not {len(raw)}")
    return raw


class Keyring:
    """The app's key provider, and the ciphers it gave, by key id.

    ``key_id`` (writers only) names the key new batches are sealed with: a str, or a
    callable returning one, asked at every batch (so an app moves to a new key whenever it
    likes, at a rotation for instance; each batch names its own key id)."""

    __slots__ = ("_provider", "_key_id", "_ciphers")

    def __init__(self, provider: KeyProvider, key_id: str | Callable[[], str] | None = None) -> None:
        if not callable(provider):
            raise TypeError(f"key_provider must be a callable key_id -> 32-byte key, not {type(provider).__name__}")
        if key_id is not None and not callable(key_id):
            check_key_id(key_id)
        _aesgcm()  # refuse at open, not at the first batch
        self._provider = provider
        self._key_id = key_id
        self._ciphers: dict[str, tuple[Any, bytes]] = {}

    def __repr__(self) -> str:
        name = getattr(self._provider, "__qualname__", type(self._provider).__name__)
        kid = "callable" if callable(self._key_id) else repr(self._key_id)
        return f"Keyring(provider={name}, key_id={kid})"

    def _cipher(self, key_id: str) -> tuple[Any, bytes]:
        found = self._ciphers.get(key_id)
        if found is not None:
            return found
        try:
            key = self._provider(key_id)
        except KeyError:
            key = None
        except Exception as e:
            # The provider's own message may quote what it holds: name the type only.
            raise KeyUnavailableError(
                f"the key provider failed for key id {key_id!r} ({type(e).__name__})", key_id=key_id
            ) from None
        if key is None:
            raise KeyUnavailableError(f"the key provider has no key for key id {key_id!r}", key_id=key_id)
        if not isinstance(key, (bytes, bytearray)) or len(key) != 32:
            given = f"{len(key)} bytes" if isinstance(key, (bytes, bytearray)) else f"a {type(key).__name__}"
            raise KeyUnavailableError(
                f"the key provider gave {given} for key id {key_id!r}, not a 32-byte AES-256 key", key_id=key_id
            )
        found = (_aesgcm()(bytes(key)), key_check(bytes(key)))
        self._ciphers[key_id] = found
        return found

    def seal(self, aad: bytes, plain: bytes) -> bytes:
        """The encrypted payload of a batch (key id, check, nonce, ciphertext and tag), bound
        to ``aad`` (the clear header fields and the link)."""
        kid = self._key_id() if callable(self._key_id) else self._key_id
        if kid is None:
            raise ValueError("this Keyring reads only: it has no key id to write with")
        kid_raw = check_key_id(kid)
        aes, check = self._cipher(kid)
        prefix = b"".join((bytes((len(kid_raw),)), kid_raw, check, os.urandom(F.NONCE_SIZE)))
        sealed: bytes = aes.encrypt(prefix[-F.NONCE_SIZE:], plain, aad + prefix)
        return prefix + sealed

    def open(self, aad: bytes, body: bytes | memoryview) -> bytes:
        """The plaintext of an encrypted payload ``body``. Raises ValueError for bytes that
        are no sealed payload or fail authentication (damage: the caller says where), and
        :class:`KeyUnavailableError` for a key id without a key or with another key."""
        n = body[0] if len(body) else 0
        head = 1 + n + F.KEY_CHECK_SIZE + F.NONCE_SIZE
        if n == 0 or len(body) < head + F.TAG_SIZE:
            raise ValueError(f"encrypted payload of {len(body)} bytes is too short for its key id and tag")
        try:
            kid = bytes(body[1 : 1 + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("encrypted payload names a key id that is not UTF-8") from None
        aes, check = self._cipher(kid)
        if bytes(body[1 + n : 1 + n + F.KEY_CHECK_SIZE]) != check:
            raise KeyUnavailableError(
                f"the key the provider gave for key id {kid!r} is not the key this batch was sealed with",
                key_id=kid,
            )
        prefix = bytes(body[:head])
        try:
            plain: bytes = aes.decrypt(prefix[-F.NONCE_SIZE:], bytes(body[head:]), aad + prefix)
        except Exception:  # cryptography's InvalidTag: the bytes or the header were changed
            raise ValueError(
                f"encrypted payload fails authentication under key id {kid!r} (ciphertext or header changed)"
            ) from None
        return plain


class _OpaqueKeys(Keyring):
    """Keys of a scan that reads the structure only (where a log ends, its chain head):
    encrypted payloads are not opened and the batch reads as holding no bytes."""

    __slots__ = ()

    def __init__(self) -> None:
        self._provider = lambda _kid: None
        self._key_id = None
        self._ciphers = {}

    def __repr__(self) -> str:
        return "Keyring(opaque)"

    def open(self, aad: bytes, body: bytes | memoryview) -> bytes:
        raise Opaque()


#: Keys for structure-only scans: encrypted payloads stay shut.
OPAQUE: Keyring = _OpaqueKeys()


def keyring(keys: KeyProvider | Keyring | None) -> Keyring | None:
    """A reader's ``key_provider=`` argument as a :class:`Keyring` (None stays None)."""
    if keys is None or isinstance(keys, Keyring):
        return keys
    return Keyring(keys)


def _import_here(module: str) -> Any:
    """``module``, imported from ``sys.path`` or else from the current directory."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        here = os.getcwd()
        top = module.split(".")[0]
        if e.name != top or here in sys.path or "" in sys.path:
            raise
    sys.path.append(here)
    try:
        return importlib.import_module(module)
    finally:
        sys.path.remove(here)


def provider_named(spec: str) -> Keyring:
    """The key provider an importable name ``MODULE:CALLABLE`` (``pkg.mod:obj.attr``)
    names, as a :class:`Keyring`: how the CLI (``--key-provider``) and a Spark job's
    executors get the app's provider, so that only its name ever travels, never a key.
    ValueError for a name that does not import, TypeError for one that is not callable.

    The module is looked for on ``sys.path`` and then in the current directory, as
    ``python -m`` would (the ``persistlog`` command's own path does not hold it)."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"needs MODULE:CALLABLE, got {spec!r}")
    try:
        target: Any = _import_here(module)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{spec}: cannot import it ({type(e).__name__}: {e})") from None
    return Keyring(target)
