"""The keys of encrypted logs on the driver and the executors.

Option ``keyProvider`` names an importable key provider (``MODULE:CALLABLE``, as the
CLI's ``--key-provider``): only that name travels in the plan and the partitions, and each
process (the driver, every executor's Python worker) imports the provider once and asks it
for the keys it needs (:func:`persistlog.reading.provider_named`). No key is ever put in an
option, a partition, a plan or a message.
"""

from __future__ import annotations

from functools import lru_cache

from persistlog.reading import Keyring, provider_named


@lru_cache(maxsize=16)
def _named(spec: str) -> Keyring:
    return provider_named(spec)


def keys_named(spec: str | None) -> Keyring | None:
    """The :class:`Keyring` of the provider ``spec`` names, cached per process (None: the
    read names no provider, and an encrypted batch raises ``KeyUnavailableError``).
    ValueError for a name that does not import or is not callable."""
    if spec is None:
        return None
    try:
        return _named(spec)
    except TypeError as e:
        raise ValueError(f"{spec}: {e}") from None
