"""The data source's options, parsed and checked once (Spark hands them over as strings)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from persistlog import Cursor

DEFAULT_MAX_PARTITION_BYTES = 128 * 1024 * 1024
MIN_PARTITION_BYTES = 64 * 1024
# Below this, splitting for parallelism costs more in task overhead than it gains (Spark's
# file sources use the same floor, spark.sql.files.openCostInBytes).
MIN_SPLIT_BYTES = 4 * 1024 * 1024

LOGS = ("all", "latest")
CONVENTIONS = ("raw", "resource")
RECOVERY = ("strict", "skip")
VIEWS = ("records", "corrupt", "heads")

KNOWN = frozenset(
    {
        "path",
        "storage_options",
        "logs",
        "from_lsn",
        "to_lsn",
        "convention",
        "recovery",
        "max_partition_bytes",
        "min_partitions",
        "view",
        "keyprovider",
    }
)

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclass(frozen=True)
class ReadOptions:
    """What one ``spark.read.format("persistlog")`` was asked to read."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    logs: str = "all"
    from_lsn: int | None = None
    to_lsn: int | None = None
    convention: str = "raw"
    recovery: str = "strict"
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES
    min_partitions: int = 1
    view: str = "records"
    #: The key provider of encrypted logs, by importable name (``MODULE:CALLABLE``): the
    #: name only, never a key (:mod:`spark_replay._keys`).
    key_provider: str | None = None
    #: The URL is a log set's root (its ``LOGSET`` marker says so): every log of the set is
    #: read, and rows carry ``log_key``. Not an option: the source finds it out.
    log_set: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, Any], ignore: frozenset[str] = frozenset()) -> ReadOptions:
        """Check ``options`` (case-insensitive names, string values); ``ValueError`` names
        the first bad one. Names in ``ignore`` (lower case) are left to another parser."""
        opts = {str(k).lower(): v for k, v in options.items() if str(k).lower() not in ignore}
        unknown = sorted(set(opts) - KNOWN)
        if unknown:
            raise ValueError(
                f"unknown persistlog option(s) {unknown}; known: {sorted(KNOWN - {'path'})}"
            )
        url = opts.get("path")
        if not url or not isinstance(url, str):
            raise ValueError('give the log URL: spark.read.format("persistlog").load(url)')
        from_lsn = _lsn(opts, "from_lsn")
        to_lsn = _lsn(opts, "to_lsn")
        if from_lsn is not None and to_lsn is not None and to_lsn < from_lsn:
            raise ValueError(f"to_lsn ({to_lsn}) is before from_lsn ({from_lsn})")
        return cls(
            url=url,
            storage_options=_storage_options(opts.get("storage_options")),
            logs=_choice(opts, "logs", LOGS),
            from_lsn=from_lsn,
            to_lsn=to_lsn,
            convention=_choice(opts, "convention", CONVENTIONS),
            recovery=_choice(opts, "recovery", RECOVERY),
            max_partition_bytes=_size(opts.get("max_partition_bytes")),
            min_partitions=_count(opts, "min_partitions"),
            view=_choice(opts, "view", VIEWS),
            key_provider=_key_provider(opts.get("keyprovider")),
        )


def _key_provider(value: Any) -> str | None:
    """Option ``keyProvider``, checked where it is given: the name must import and be
    callable here (the executors import it again, once per process)."""
    if value is None or str(value).strip() == "":
        return None
    from ._keys import keys_named

    spec = str(value).strip()
    try:
        keys_named(spec)
    except ValueError as e:
        raise ValueError(f"option keyProvider must name an importable key provider MODULE:CALLABLE: {e}") from None
    return spec


def _choice(opts: Mapping[str, Any], name: str, allowed: tuple[str, ...]) -> str:
    value = opts.get(name)
    if value is None:
        return allowed[0]
    value = str(value).strip().lower()
    if value not in allowed:
        raise ValueError(f"option {name} must be one of {list(allowed)}, not {opts[name]!r}")
    return value


def _int_option(opts: Mapping[str, Any], name: str, what: str, minimum: int, below: str) -> int | None:
    """Option ``name`` as an integer of at least ``minimum``; None when not given."""
    value = opts.get(name)
    if value is None or value == "":
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ValueError(f"option {name} must be {what}, not {value!r}") from None
    if number < minimum:
        raise ValueError(f"option {name} must be {below}, not {number}")
    return number


def _lsn(opts: Mapping[str, Any], name: str) -> int | None:
    return _int_option(opts, name, "an integer LSN", 1, ">= 1 (LSNs start at 1)")


def _count(opts: Mapping[str, Any], name: str) -> int:
    count = _int_option(opts, name, "a positive integer", 1, "a positive integer")
    # Not given: the planning host's cores, right for local Spark, a fair guess on a
    # cluster's driver.
    return count if count is not None else os.cpu_count() or 1


def _size(value: Any) -> int:
    if value is None or value == "":
        return DEFAULT_MAX_PARTITION_BYTES
    return _byte_count("max_partition_bytes", value, MIN_PARTITION_BYTES)


def _storage_options(value: Any) -> dict[str, Any]:
    if value is None or value == "":
        return {}
    if isinstance(value, dict):
        return dict(value)
    try:
        parsed = json.loads(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"option storage_options must be a JSON object: {e}") from None
    if not isinstance(parsed, dict):
        raise ValueError("option storage_options must be a JSON object such as {\"key\": \"...\"}")
    return parsed


# -- streaming -----------------------------------------------------------------------------

STARTING_POSITIONS = ("restore", "earliest", "latest")
ON_RETENTION_GAP = ("fail", "restore")

STREAM_KNOWN = frozenset(
    {"startingposition", "maxrecordspertrigger", "maxbytespertrigger", "onretentiongap", "waitforlog"}
)
# What a stream chooses otherwise: where to start, and never passing damage over.
BATCH_ONLY = ("logs", "from_lsn", "to_lsn", "view")


@dataclass(frozen=True)
class StreamOptions:
    """What one ``spark.readStream.format("persistlog")`` was asked to follow."""

    read: ReadOptions
    #: ``restore``, ``earliest``, ``latest``, an LSN, a commit time, or a cursor
    #: (:func:`starting_position`).
    starting_position: str = "restore"
    max_records: int | None = None
    max_bytes: int | None = None
    on_retention_gap: str = "fail"
    #: Whether a location holding no log yet is waited on (else: LogNotFoundError).
    wait_for_log: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> StreamOptions:
        """Check ``options`` as :meth:`ReadOptions.parse` does, plus the streaming ones."""
        opts = {str(k).lower(): v for k, v in options.items()}
        given = [name for name in BATCH_ONLY if opts.get(name) not in (None, "")]
        if given:
            raise ValueError(
                f"option(s) {given} are for batch reads; a stream starts where startingPosition "
                "says (restore, earliest, latest or a cursor)"
            )
        if str(opts.get("recovery") or "strict").strip().lower() != "strict":
            raise ValueError("a stream reads with recovery=strict: damage stops the query, it is never passed over")
        read = ReadOptions.parse(opts, ignore=STREAM_KNOWN)
        start = str(opts.get("startingposition") or "restore").strip()
        if start.lower() in STARTING_POSITIONS:
            start = start.lower()
        starting_position(start)  # a bad one fails here, before the query starts
        max_bytes = opts.get("maxbytespertrigger")
        return cls(
            read=read,
            starting_position=start,
            max_records=_int_option(opts, "maxrecordspertrigger", "a positive integer", 1, "a positive integer"),
            max_bytes=None if max_bytes in (None, "") else _byte_count("maxBytesPerTrigger", max_bytes, 1),
            on_retention_gap=_choice(opts, "onretentiongap", ON_RETENTION_GAP),
            wait_for_log=_choice(opts, "waitforlog", ("false", "true")) == "true",
        )


def starting_position(value: str) -> str | int | datetime | Cursor:
    """What option ``startingPosition`` names: ``restore``, ``earliest`` or ``latest`` (as
    they are), an LSN (``"1200"``), a commit time (an ISO 8601 time with its offset, such
    as ``"2026-11-27T05:00:00Z"``, or an aware ``datetime``, which Spark passes as its
    text), or a follower cursor (``log:segment:offset:next_lsn`` or its JSON object).
    ``ValueError`` names the forms for anything else."""
    text = value.strip()
    if text.lower() in STARTING_POSITIONS:
        return text.lower()
    forms = (
        "option startingPosition must be restore, earliest, latest, an LSN (such as 1200), a "
        "commit time with its UTC offset (such as 2026-11-27T05:00:00Z) or a cursor "
        "('log:segment:offset:next_lsn' or its JSON object)"
    )
    if re.fullmatch(r"[+-]?\d+", text):
        lsn = int(text)
        if lsn < 1:
            raise ValueError(f"{forms}, not {value!r} (LSNs start at 1)")
        return lsn
    try:
        if text.startswith("{"):
            return Cursor.from_dict(json.loads(text))
        if text.count(":") == 3 and "-" not in text:
            return Cursor.parse(text)
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{forms}, not {value!r}") from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError(f"{forms}, not {value!r}: a time must say its UTC offset (Z or +HH:MM)")
    return when


def _byte_count(name: str, value: Any, minimum: int) -> int:
    m = _SIZE.match(str(value))
    if m is None:
        raise ValueError(f"option {name} must be a byte count such as 134217728 or 128m, not {value!r}")
    size = int(m.group(1)) * _UNITS[m.group(2).lower()]
    if size < minimum:
        raise ValueError(f"option {name} must be at least {minimum}, not {size}")
    return size
