"""Replay persistlog logs into Spark DataFrames: audit, analytics, state as of any point.

::

    import spark_replay
    spark_replay.register(spark)                       # or spark_replay.local_session()
    df = (spark.read.format("persistlog")
          .option("convention", "resource")
          .option("storage_options", '{"anon": false}')
          .load("s3://bucket/app/log"))
    live = spark_replay.state(df, as_of_time="2025-01-31T00:00:00+00:00")

The same code runs on a laptop (``local[*]``) and on a cluster: executors read the logs
themselves through fsspec (``s3://`` needs ``s3fs``, no Hadoop S3 jars), with the same
decoder restore uses.

Options (all optional except the URL given to ``load``):

``storage_options``
    JSON object passed to fsspec (credentials, ``client_kwargs``...), on the driver and on
    every executor.
``logs``
    ``all`` (default): every retained log, oldest first. ``latest``: from the newest
    complete log on, exactly the records :func:`persistlog.restore` replays.
``from_lsn`` / ``to_lsn``
    Only records with ``from_lsn <= lsn <= to_lsn`` (whole logs outside are not read).
``convention``
    ``raw`` (default) or ``resource``: also split :class:`persistlog.ResourceStore`
    records ``{"op": "put"|"del", "key": k, "value": v}`` into columns.
``recovery``
    ``strict`` (default): damage other than a torn tail fails the job with the
    :class:`persistlog.CorruptLogError` message (destination, log, segment, offset).
    ``skip``: damaged batches are passed over; :func:`corrupt_report` lists them.
``max_partition_bytes``
    Upper bound of log bytes per task (default ``128m``). Each segment is a partition;
    small neighbouring segments of a log are packed together and larger ones are split
    at batch boundaries.
``min_partitions``
    Split a small read into at least this many tasks where batch boundaries allow (not
    below 4 MiB each). Default: the driver's cores; :func:`read` passes the session's
    default parallelism.

Columns, one row per record, in LSN order within each partition:

============  =========  ================================================================
log_seq       long       the log (generation) holding the record
segment       long       the segment number within that log
lsn           long       the record's global position, strictly increasing across logs
commit_time   timestamp  when the record's batch was committed (UTC, microseconds)
kind          string     ``update`` (from ``log.update()``) or ``snapshot`` (enumeration)
record        string     the CBOR record as JSON text, lossless (rule: ``docs/JSON.md``)
base_log      long       the newest log of this read whose snapshot was complete at this
                         record (or the first log ever): a replay from it reproduces the
                         full state as of this record; null when the read holds none
op            string     ``convention="resource"`` only: ``put``/``del``, else null
key           string     ``convention="resource"`` only: a string key as itself, any other
                         key as its JSON text (filter with ``df.key == "user:3"``)
key_json      string     ``convention="resource"`` only: the key as lossless JSON text
                         (``1``, ``"1"`` and ``true`` differ); :func:`state` groups by it
value         string     ``convention="resource"`` only: the value as JSON text (puts)
============  =========  ================================================================

``keyProvider``
    The key provider of an encrypted log, by importable name ``MODULE:CALLABLE`` (as the
    CLI's ``--key-provider``): the driver and every executor import it once per process;
    only the name is in the plan and the partitions, never a key. Without it (or with the
    wrong keys) a read of an encrypted batch fails with
    :class:`persistlog.KeyUnavailableError`.

``view``
    ``records`` (default): the rows above. ``corrupt``: the damage report of
    :func:`corrupt_report` instead. ``heads``: the signed chain heads, one row per signed
    checkpoint or seal: ``log_seq``, ``segment``, ``offset``, ``kind`` (``checkpoint`` or
    ``seal``), ``lsn`` (the LSN it signs: a checkpoint's, a seal's ``next_lsn``), ``head``
    (the chain head it signs, hex) and ``key`` (the signing key's id); the logs are checked
    as any read checks them, no key provider is needed, and signatures are checked by
    ``persistlog verify --public-key`` only.

A torn tail of an unsealed log (a crash artefact) is dropped, as restore drops it. The
hash chain is checked as restore checks it, within each range, across ranges and from the
end of each log to the next log's first link. A URL
holding no log fails the read with :class:`persistlog.LogNotFoundError`.

The root of a :class:`persistlog.LogSet` (its ``LOGSET`` marker says so) reads as one table
of every log of the set: each row carries ``log_key`` (a ``string`` column, first), the key
of its log, and otherwise that log's own columns (``log_seq``, ``lsn`` and ``base_log`` are
per log). The options apply to every log (``logs=latest``: each log from its newest
complete log; ``from_lsn``/``to_lsn``: in each log's LSNs). A single log's schema has no
``log_key``. :func:`state` of such a frame replays each log on its own. Streaming a set is
not supported yet: the query fails saying so.

``spark.readStream.format("persistlog").load(url)`` follows the live log with the same
columns and options, plus ``startingPosition`` (``restore``, ``earliest``, ``latest``, an
LSN, a commit time with its UTC offset, or a cursor; an LSN or time the logs do not hold
fails with :class:`persistlog.PositionError`), ``maxRecordsPerTrigger``/``maxBytesPerTrigger`` and ``onRetentionGap``
(``fail`` or ``restore``); its offsets are follower cursors (:mod:`spark_replay._stream`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

try:
    import pyspark as _pyspark  # noqa: F401  (only to say what is missing, at once)
except ImportError as _e:
    from persistlog import MissingDependencyError as _Missing

    raise _Missing(
        "spark_replay needs PySpark (and pyarrow): pip install 'persistlog[spark]'",
        package="pyspark",
        extra="spark",
    ) from _e

from destinations import destination_url as _destination_url

from ._session import local_session
from ._source import PersistLogDataSource
from ._state import resolve_lsn, state

if TYPE_CHECKING:
    import os
    from typing import Any

    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "PersistLogDataSource",
    "corrupt_report",
    "local_session",
    "read",
    "register",
    "resolve_lsn",
    "state",
]


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("persistlog")`` and ``spark.readStream.format("persistlog")``
    available in this session (idempotent)."""
    spark.dataSource.register(PersistLogDataSource)


def _reader(spark: SparkSession, options: dict[str, Any]) -> Any:
    import json

    register(spark)
    reader = spark.read.format("persistlog")
    for name, value in options.items():
        if value is None:
            continue
        if name == "storage_options" and not isinstance(value, str):
            value = json.dumps(value)
        reader = reader.option(name, str(value))
    return reader


def read(spark: SparkSession, url: str | os.PathLike[str], **options: Any) -> DataFrame:
    """``spark.read.format("persistlog")`` with ``options`` given as Python values
    (``storage_options`` as a dict) and ``url`` a string or an ``os.PathLike``;
    registers the source if needed."""
    if "min_partitions" not in options:
        try:
            options["min_partitions"] = spark.sparkContext.defaultParallelism
        except Exception:  # Spark Connect has no SparkContext: keep the source's default
            pass
    df: DataFrame = _reader(spark, options).load(_destination_url(url))
    return df


def corrupt_report(spark: SparkSession, url: str | os.PathLike[str], **options: Any) -> DataFrame:
    """Every damaged range of the logs at ``url``: what ``recovery="skip"`` passes over,
    plus the torn tails any read drops.

    Columns: ``log_seq``, ``segment`` (number), ``segment_name``, ``offset``, ``length``
    (bytes, when known), ``kind`` (``skipped`` or ``torn``) and ``reason``. The logs are
    scanned (checksums, chains) but records are only decoded, never converted. Takes the
    read options (``storage_options``, ``logs``, ``from_lsn``...).
    """
    df: DataFrame = _reader(spark, {**options, "view": "corrupt"}).load(_destination_url(url))
    return df


def __dir__() -> list[str]:
    """The public names only (``dir(spark_replay)``, tab completion)."""
    return sorted(__all__)
