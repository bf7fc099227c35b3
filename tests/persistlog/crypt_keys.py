"""Fixed test keys and a key provider that names them: what an app's provider looks like
(``--key-provider crypt_keys:provider``). Test keys only, never real ones."""

from __future__ import annotations

KEYS = {
    "2026-10": bytes(range(32)),
    "2026-11": bytes(range(100, 132)),
}
#: Another key under an id the provider knows: what a misconfigured provider gives.
WRONG = {"2026-10": bytes(range(200, 232)), "2026-11": bytes(range(50, 82))}


def provider(key_id: str) -> bytes:
    """The key of ``key_id`` (KeyError for an id it does not know)."""
    return KEYS[key_id]


def wrong(key_id: str) -> bytes:
    return WRONG[key_id]
