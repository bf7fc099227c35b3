"""State reconstruction: the live resources as of an LSN or a time."""

from __future__ import annotations

import datetime
import logging
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as sf

logger = logging.getLogger("spark_replay")

_REQUIRED = ("log_seq", "lsn", "commit_time", "base_log")
# The column naming each row's log in a frame read from a log set.
LOG_KEY = "log_key"


def _column(value: Column | str | None, df: DataFrame, default: str | None, what: str) -> Column:
    if isinstance(value, Column):
        return value
    if isinstance(value, str):
        return sf.col(value)
    if value is not None:
        raise TypeError(f"{what} must be a Column or a column name, not {type(value).__name__}")
    if default is not None and default in df.columns:
        return sf.col(default)
    raise ValueError(
        f"this frame has no {default!r} column: pass {what}= as a column expression "
        f"(e.g. pyspark.sql.functions.get_json_object('record', '$.id')), or read with convention='resource'"
    )


def parse_as_of_time(when: datetime.datetime | str) -> datetime.datetime:
    """``as_of_time`` as a datetime: a datetime as it is, or an ISO-8601 string (``Z`` or an
    offset, or none: then it is naive). Raises before any Spark work is done."""
    if isinstance(when, str):
        try:
            return datetime.datetime.fromisoformat(when.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"as_of_time must be an ISO-8601 time such as 2025-01-31T00:00:00Z, not {when!r}"
            ) from None
    if not isinstance(when, datetime.datetime):
        raise TypeError(f"as_of_time must be a datetime or an ISO-8601 string, not {type(when).__name__}")
    return when


def _micros(when: datetime.datetime | str, session_zone: str) -> int:
    """Microseconds since the epoch. A naive time (what PySpark itself returns for a
    ``timestamp``) is read in the session time zone, ``spark.sql.session.timeZone``, as
    Spark reads one."""
    when = parse_as_of_time(when)
    if when.tzinfo is None:
        import zoneinfo

        when = when.replace(tzinfo=zoneinfo.ZoneInfo(session_zone))
    delta = when - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def resolve_lsn(
    df: DataFrame, as_of_lsn: int | None = None, as_of_time: datetime.datetime | str | None = None
) -> int | None:
    """The LSN a state request means: ``as_of_lsn``, the last record committed at or before
    ``as_of_time``, or (neither given) the last record in ``df``; None if ``df`` is empty."""
    if as_of_lsn is not None and as_of_time is not None:
        raise ValueError("give as_of_lsn or as_of_time, not both")
    if as_of_lsn is not None:
        if not isinstance(as_of_lsn, int) or isinstance(as_of_lsn, bool) or as_of_lsn < 1:
            raise ValueError(f"as_of_lsn must be an integer >= 1 (LSNs start at 1), not {as_of_lsn!r}")
        return as_of_lsn
    if as_of_time is not None:
        zone = df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
        cutoff = sf.timestamp_micros(sf.lit(_micros(as_of_time, zone)))
        row = df.filter(sf.col("commit_time") <= cutoff).agg(sf.max("lsn").alias("lsn")).first()
        if row is None or row["lsn"] is None:
            raise ValueError(f"no record in this frame was committed at or before {as_of_time}")
        return int(row["lsn"])
    row = df.agg(sf.max("lsn").alias("lsn")).first()
    return None if row is None or row["lsn"] is None else int(row["lsn"])


def state(
    df: DataFrame,
    *,
    key: Column | str | None = None,
    op: Column | str | None = None,
    as_of_lsn: int | None = None,
    as_of_time: datetime.datetime | str | None = None,
) -> DataFrame:
    """The live resources as of ``as_of_lsn`` (or ``as_of_time``; default: the newest record).

    ``df`` is a frame read by the ``persistlog`` source, with all its rows (projections
    are fine; drop no rows before calling this, since a replay needs the whole history
    from its starting log). Per key the record with the highest LSN at or before the point
    wins; if its ``op`` is ``"del"`` the key is absent. Rows whose ``op`` is neither
    ``"put"`` nor ``"del"`` and rows whose key is null are ignored (as
    :class:`persistlog.ResourceStore` ignores foreign records).

    ``key`` and ``op`` default to the ``key``/``op`` columns of a ``convention="resource"``
    frame; for raw frames pass column expressions (``op`` may be omitted: every record is
    then a put). The replay starts at the newest log whose snapshot was complete at that
    point, exactly as restore would; ``ValueError`` says so when the point is older than
    the history the frame holds (retention deleted it, or the read started later).

    Keys are told apart by their lossless JSON text: on a ``convention="resource"``
    frame the default groups by ``key_json`` (so ``1``, ``"1"`` and ``True`` are three
    keys, though ``key`` shows the first two alike).

    Returns one row per live key: ``key`` (the key expression's value; by default the
    ``key`` and ``key_json`` columns) and the winning record's other columns, minus ``op``.

    A frame read from a log set (it has a ``log_key`` column) holds many logs, each with
    its own LSNs: each log's state is replayed on its own, as of its newest record or of
    ``as_of_time`` (a log with no record by then has no state), and keys are grouped per
    ``log_key``, which leads the result's columns. ``as_of_lsn`` is refused there.
    """
    missing = [c for c in _REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"state() needs a frame read by the persistlog source; missing columns {missing}")
    # The lossless key: "key" shows 1 and "1" alike, "key_json" never does.
    lossless = key is None and "key_json" in df.columns
    key_col = sf.col("key_json") if lossless else _column(key, df, "key", "key")
    # Columns the result names itself ahead of the winning record's others.
    leading = ("key", "key_json") if lossless else ("key",)
    op_col = _column(op, df, "op", "op") if op is not None or "op" in df.columns else sf.lit("put")
    if LOG_KEY in df.columns:
        return _state_of_each_log(df, key_col, op_col, lossless, leading, as_of_lsn, as_of_time)
    target = resolve_lsn(df, as_of_lsn, as_of_time)
    if target is None:
        logger.info("state(): the frame holds no record; the state is empty")
        return _shape(df.limit(0).withColumn("_k", key_col), df, lossless)
    # One aggregate, no sort: the last record at or before the point, and its replay base.
    point = (
        df.filter(sf.col("lsn") <= target)
        .agg(sf.max("lsn").alias("lsn"), sf.max_by("base_log", "lsn").alias("base_log"))
        .first()
    )
    if point is None or point["lsn"] is None:
        first = df.agg(sf.min("lsn")).first()
        raise ValueError(
            f"LSN {target} is before the first record this frame holds (LSN {first[0] if first else '?'}); "
            "its state is older than the retained history"
        )
    if point["base_log"] is None:
        raise ValueError(_too_old(df, target))
    base = int(point["base_log"])
    logger.info("state as of LSN %d: replaying from log %d", target, base)
    history = df.filter((sf.col("log_seq") >= base) & (sf.col("lsn") <= target))
    return _last_writes(history, key_col, op_col, lossless, leading, ())


def _last_writes(
    history: DataFrame, key_col: Column, op_col: Column, lossless: bool, leading: tuple[str, ...],
    per: tuple[str, ...],
) -> DataFrame:
    """The live keys of ``history`` (the rows a replay reads): per key (and per column of
    ``per``) the record with the highest LSN, unless it is a delete."""
    history = (
        history.withColumn("_k", key_col)
        .withColumn("_op", op_col)
        .filter(sf.col("_k").isNotNull() & sf.col("_op").isin("put", "del"))
    )
    others = [c for c in history.columns if c not in ("_k", "op", *per, *leading)]
    kept = [*leading, *others] if lossless else others
    last = history.groupBy(*per, "_k").agg(sf.max_by(sf.struct(*kept), sf.col("lsn")).alias("_w"))
    live = last.filter(sf.col("_w._op") == "put")
    shown = [sf.col(f"_w.{c}").alias(c) for c in kept if c != "_op"]
    return live.select(*per, *shown) if lossless else live.select(*per, sf.col("_k").alias("key"), *shown)


def _state_of_each_log(
    df: DataFrame, key_col: Column, op_col: Column, lossless: bool, leading: tuple[str, ...],
    as_of_lsn: int | None, as_of_time: datetime.datetime | str | None,
) -> DataFrame:
    """:func:`state` of a frame read from a log set: each log's own state, as of its newest
    record or ``as_of_time`` (a log with no record by then has none), keys grouped per
    ``log_key``. LSNs are per log, so ``as_of_lsn`` is refused."""
    if as_of_lsn is not None:
        raise ValueError(
            "as_of_lsn does not apply to a frame of a log set: LSNs are per log. Give as_of_time, or "
            "filter one log_key first and drop the column"
        )
    rows = df
    if as_of_time is not None:
        zone = df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
        rows = df.filter(sf.col("commit_time") <= sf.timestamp_micros(sf.lit(_micros(as_of_time, zone))))
    points = rows.groupBy(LOG_KEY).agg(
        sf.max("lsn").alias("_target"), sf.max_by("base_log", "lsn").alias("_base")
    )
    unreplayable = [r[LOG_KEY] for r in points.filter(sf.col("_base").isNull()).select(LOG_KEY).limit(6).collect()]
    if unreplayable:
        shown = ", ".join(repr(k) for k in unreplayable[:5]) + (", ..." if len(unreplayable) > 5 else "")
        raise ValueError(
            f"cannot reconstruct the state of log(s) {shown}: retention kept no log whose snapshot "
            "was complete by then (or none is complete yet)"
        )
    history = df.join(points, LOG_KEY).filter(
        (sf.col("log_seq") >= sf.col("_base")) & (sf.col("lsn") <= sf.col("_target"))
    ).drop("_base", "_target")
    return _last_writes(history, key_col, op_col, lossless, leading, (LOG_KEY,))


def _shape(empty: DataFrame, df: DataFrame, lossless: bool) -> DataFrame:
    leading = ("key", "key_json") if lossless else ("key",)
    others = [c for c in df.columns if c not in ("op", *leading)]
    if lossless:
        return empty.select(*leading, *others)
    return empty.select(sf.col("_k").alias("key"), *others)


def _too_old(df: DataFrame, target: int) -> str:
    row = df.filter(sf.col("base_log").isNotNull()).agg(sf.min("lsn").alias("lsn")).first()
    available: Any = row["lsn"] if row is not None else None
    if available is None:
        return (
            f"cannot reconstruct the state as of LSN {target}: no log in this frame has a complete "
            "snapshot (its history does not start at a complete log's enumeration)"
        )
    return (
        f"cannot reconstruct the state as of LSN {target}: it is older than the history this frame "
        f"holds (retention kept no log whose snapshot was complete by then); the earliest point "
        f"available is LSN {available}"
    )
