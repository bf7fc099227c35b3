"""The replay job: logs in, ``events/`` and ``state/`` Parquet out, a summary printed.

::

    python -m spark_replay URL --out DIR [--as-of-lsn N | --as-of-time T]
                           [--convention resource|raw] [--storage-option K=V ...]
    python -m spark_replay URL --out DIR --follow [--checkpoint DIR] [--trigger SECONDS]
    spark-submit --master yarn .../spark_replay/__main__.py URL --out s3a://bucket/replay

Run with plain ``python`` it starts a local Spark (``local[*]``) with no configuration,
whose own log goes to a file (``-v`` shows it); under ``spark-submit`` it uses the session
spark-submit made. A failure is one line on stderr (what failed, where, what to do) and a
non-zero exit; a local ``--out`` is written beside itself and renamed into place at the
end, so a failed run leaves nothing there. An existing ``--out`` is refused before any work
unless ``--overwrite`` is given.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import sys
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any, TextIO

from persistlog import Cursor, DestinationError, PositionError
from persistlog.reading import UsageError
from persistlog.reading import parse_storage_options as _parse_cli_storage_options

logger = logging.getLogger("spark_replay")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class JobError(Exception):
    """A problem with the job's input, reported as one line and a non-zero exit."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code



def _as_of_time(text: str) -> str:
    """``--as-of-time``, checked before Spark starts (a bad time is a usage error at once)."""
    from ._state import parse_as_of_time

    try:
        parse_as_of_time(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spark_replay",
        description="Replay persistlog logs into Parquet: every record (events/) and the live "
        "resources as of a point (state/).",
    )
    p.add_argument("url", help="the log destination (a directory, s3://bucket/prefix, ...)")
    p.add_argument("--out", required=True, help="output directory (any path Spark can write)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--as-of-lsn", type=int, metavar="N", help="state as of this LSN")
    when.add_argument(
        "--as-of-time", metavar="T", type=_as_of_time,
        help="state as of this time (ISO-8601, e.g. 2025-01-31T00:00:00Z; without an offset, the "
        "Spark session's time zone)",
    )
    p.add_argument(
        "--convention",
        choices=("resource", "raw"),
        default="resource",
        help="resource (default): ResourceStore records {op, key, value}; raw: give --key for a state",
    )
    p.add_argument("--key", metavar="SQL", help="raw logs: SQL expression of a record's key, e.g. \"get_json_object(record, '$.id')\"")
    p.add_argument("--op", metavar="SQL", help="raw logs: SQL expression giving 'put' or 'del' (default: every record is a put)")
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="K=V",
        help="fsspec option (repeatable); V is parsed as JSON when it can be; dotted K nests "
        "(client_kwargs.endpoint_url=http://...)",
    )
    p.add_argument(
        "--key-provider",
        metavar="MODULE:CALLABLE",
        help="key provider of an encrypted log: an importable callable key_id -> 32-byte key, "
        "imported by the driver and by every executor (only its name travels, never a key)",
    )
    p.add_argument("--logs", choices=("all", "latest"), default="all", help="all retained logs (default) or from the newest complete one")
    p.add_argument("--recovery", choices=("strict", "skip"), default="strict", help="strict (default): corruption fails the job; skip: pass over it and write _corrupt/")
    p.add_argument("--max-partition-bytes", metavar="BYTES", help="log bytes per task (default 128m)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out (else it is refused)")
    p.add_argument(
        "--follow",
        action="store_true",
        help="keep going: append every new record to OUT/events as a streaming query until "
        "interrupted (Ctrl-C); rerunning resumes where it stopped",
    )
    p.add_argument("--checkpoint", metavar="DIR", help="--follow: the query's checkpoint (default OUT/_checkpoint)")
    p.add_argument(
        "--trigger", type=float, default=1.0, metavar="SECONDS", help="--follow: seconds between micro-batches (default 1)"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="log errors only")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress, and show Spark's own log")
    return p


def parse_storage_options(pairs: list[str]) -> dict[str, Any]:
    """``--storage-option`` values, parsed as the ``persistlog`` CLI parses them."""
    try:
        return _parse_cli_storage_options(pairs)
    except UsageError as e:
        raise JobError(str(e)) from None


@dataclass
class Summary:
    """What the job wrote, as printed."""

    url: str
    out: str
    logs: list[int]
    records: int
    first_lsn: int | None
    last_lsn: int | None
    first_time: Any
    last_time: Any
    as_of_lsn: int | None
    keys: int | None
    corrupt: int | None
    #: A log set: how many of its logs (keys) were read, and how many generations in all.
    log_keys: int | None = None
    log_count: int = 0
    as_of_time: str | None = None

    def print(self, stream: TextIO) -> None:
        if self.log_keys is not None:
            # A set: every log numbers its own seqs and LSNs, so no range means anything.
            logs = f"{self.log_keys} log(s) of a log set ({self.log_count} generations)"
            lsns = ""
        else:
            logs = f"{len(self.logs)}" + (f" (log {self.logs[0]}..{self.logs[-1]})" if self.logs else "")
            lsns = f" (LSN {self.first_lsn}..{self.last_lsn})" if self.records else ""
        lines = [
            f"replayed {self.url}",
            f"  logs:       {logs}",
            f"  records:    {self.records}" + lsns,
            f"  time range: {self.first_time} .. {self.last_time}" if self.records else "  time range: -",
        ]
        if self.keys is not None and self.log_keys is not None:
            when = f"as of {self.as_of_time}" if self.as_of_time else "each log as of its newest record"
            lines.append(f"  keys:       {self.keys} live ({when})")
        elif self.keys is not None:
            lines.append(f"  keys:       {self.keys} live as of LSN {self.as_of_lsn}")
        else:
            lines.append("  keys:       - (no state: raw logs need --key)")
        if self.corrupt is not None:
            lines.append(f"  corrupt:    {self.corrupt} damaged range(s) passed over, see {self.out}/_corrupt")
        by = "log_key, log_seq" if self.log_keys is not None else "log_seq"
        lines.append(f"  written:    {self.out}/events (by {by})" + ("" if self.keys is None else f", {self.out}/state"))
        stream.write("\n".join(lines) + "\n")


def _session(spark_log: str | None) -> Any:
    """The job's session; a local Spark's JVM (and the Python workers it starts) write
    their output to ``spark_log`` rather than to the terminal."""
    from pyspark.sql import SparkSession

    from . import local_session, register

    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        # Started by spark-submit: its master and configuration rule.
        spark = SparkSession.builder.appName("persistlog-replay").getOrCreate()
        register(spark)
        return spark
    if spark_log is None:
        return local_session()
    # The JVM inherits stderr when it starts: point it at the log file for that moment.
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(spark_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
        return local_session()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _local_path(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


@dataclass
class Output:
    """Where the job writes: ``work``, renamed to ``final`` once everything is written
    (local paths), or ``final`` itself (other file systems, where a rename is a copy)."""

    final: str
    work: str
    overwrite: bool

    @classmethod
    def prepare(cls, out: str, overwrite: bool) -> Output:
        """Refuse an existing local ``out`` without ``overwrite``, before any work."""
        final = out.rstrip("/") or out
        if not _is_local(final):
            return cls(final, final, overwrite)
        path = _local_path(final)
        if os.path.lexists(path) and not overwrite:
            raise JobError(f"--out {out} already exists: pass --overwrite to replace it, or choose another --out")
        parent, name = os.path.split(os.path.abspath(path))
        try:
            os.makedirs(parent, exist_ok=True)  # as Spark would have
        except OSError as e:
            raise JobError(f"--out {out}: cannot create {parent}: {e.strerror}") from None
        # Beside the output, so that the final rename stays on one file system.
        return cls(final, os.path.join(parent, f".{name}.partial-{uuid.uuid4().hex[:12]}"), overwrite)

    @property
    def staged(self) -> bool:
        return self.work != self.final

    def check_remote(self, spark: Any) -> None:
        """The same refusal for a non-local ``out``, through Spark's file system."""
        if self.staged or self.overwrite:
            return
        try:
            jvm = spark._jvm
            path = jvm.org.apache.hadoop.fs.Path(self.final)
            exists = path.getFileSystem(spark._jsc.hadoopConfiguration()).exists(path)
        except Exception:  # no JVM (Spark Connect) or no driver for it: Spark's own check
            return
        if exists:
            raise JobError(f"--out {self.final} already exists: pass --overwrite to replace it, or choose another --out")

    def commit(self) -> None:
        if not self.staged:
            return
        final = _local_path(self.final)
        if os.path.lexists(final):
            shutil.rmtree(final) if os.path.isdir(final) and not os.path.islink(final) else os.remove(final)
        os.rename(self.work, final)

    def discard(self) -> None:
        if self.staged:
            shutil.rmtree(self.work, ignore_errors=True)


def _new_spark_log() -> str:
    """A file for a local Spark's own output (removed unless a failure names it)."""
    fd, path = tempfile.mkstemp(prefix="persistlog-replay-spark-", suffix=".log")
    os.close(fd)
    return path


_PY_ERROR = re.compile(r"((?:persistlog|destinations|builtins)?\.?\b(?:CorruptLogError|KeyUnavailableError|DestinationError|LogNotFoundError|MissingDependencyError|ResetRequired|ValueError|FileNotFoundError|PermissionError)): (.+)")


def _explain(exc: BaseException) -> str:
    """The Python error a Spark task died of, without the Java and Python stack traces."""
    matches = _PY_ERROR.findall(str(exc))
    if matches:
        name, message = matches[-1]
        return f"{name.rsplit('.', 1)[-1]}: {message.strip()}"
    first = str(exc).strip().splitlines()
    return first[0] if first else type(exc).__name__


def _check_input(url: str, storage_options: dict[str, Any]) -> bool:
    """Fail fast, before Spark starts, when there is nothing to replay; True when ``url``
    is a log set."""
    from destinations import open_destination
    from persistlog import LogSet
    from persistlog.reading import list_logs

    try:
        dest = open_destination(url, **storage_options)
    except (ValueError, ImportError, TypeError) as e:
        raise JobError(f"cannot open {url}: {e}") from None
    try:
        if list_logs(dest):
            return False
        if _is_log_set(url, storage_options):
            if next(iter(LogSet(url, create=False, storage_options=storage_options).keys()), None) is None:
                raise JobError(f"the log set at {url} holds no log")
            return True
        why = dest.why_not_creatable() or ("" if dest.exists() else dest.describe_missing())
        raise JobError(f"no persistlog logs at {url}" + (f": {why}" if why else ""))
    except JobError:
        raise
    except DestinationError as e:  # it names the URL already
        raise JobError(str(e)) from None
    except Exception as e:  # any storage complaint is bad input from the job's point of view
        raise JobError(f"cannot list {url}: {e}") from None
    finally:
        dest.close()


def _is_log_set(url: str, storage_options: dict[str, Any]) -> bool:
    from persistlog.reading import read_log_set_marker

    try:
        return read_log_set_marker(url, storage_options) is not None
    except Exception as e:  # a marker this version cannot read, or storage trouble
        raise JobError(f"cannot read {url}: {e}") from None


def prepare(args: argparse.Namespace) -> tuple[dict[str, Any], Output, bool]:
    """Every check that needs no Spark: arguments, the input (and whether it is a log
    set), the output."""
    storage_options = parse_storage_options(args.storage_option)
    if args.convention == "raw" and args.op and not args.key:
        raise JobError("--op needs --key")
    if args.convention == "resource" and (args.key or args.op):
        raise JobError("--key/--op are for --convention raw")
    output = Output.prepare(args.out, args.overwrite)
    log_set = _check_input(args.url, storage_options)
    if log_set and args.as_of_lsn is not None:
        raise JobError(f"{args.url} is a log set, whose logs each number their own LSNs: --as-of-lsn does not apply; give --as-of-time")
    if args.as_of_lsn is not None:
        try:  # an LSN the logs do not hold (past the end, before retention) has no state
            Cursor.at_lsn(args.url, args.as_of_lsn, storage_options=storage_options)
        except PositionError as e:
            raise JobError(f"--as-of-lsn {args.as_of_lsn}: {e}") from None
    return storage_options, output, log_set


def run(
    args: argparse.Namespace, spark: Any, stdout: TextIO, prepared: tuple[dict[str, Any], Output, bool] | None = None
) -> Summary:
    """Replay into ``output.work``; the caller commits or discards it."""
    from pyspark.sql import functions as sf

    from . import corrupt_report, read
    from ._state import resolve_lsn, state

    storage_options, output, log_set = prepared or prepare(args)
    output.check_remote(spark)
    options = {
        "storage_options": storage_options or None,
        "convention": args.convention,
        "logs": args.logs,
        "recovery": args.recovery,
        "max_partition_bytes": args.max_partition_bytes,
        "keyProvider": args.key_provider,
    }
    mode = "overwrite" if args.overwrite and not output.staged else "errorifexists"
    out = output.work
    events_path, state_path = f"{out}/events", f"{out}/state"
    df = read(spark, args.url, **options)
    logger.info("writing %s", events_path)
    by = ["log_key", "log_seq"] if log_set else ["log_seq"]
    df.write.mode(mode).partitionBy(*by).parquet(events_path)
    # Later steps read the Parquet just written rather than decoding the logs again.
    if log_set:
        # With the source's schema: partition values (keys such as "7") keep their types.
        events = spark.read.schema(df.schema).parquet(events_path)
    else:
        events = spark.read.parquet(events_path).withColumn("log_seq", sf.col("log_seq").cast("long"))
    stats = events.agg(
        sf.count(sf.lit(1)).alias("n"),
        sf.min("lsn").alias("lo"),
        sf.max("lsn").alias("hi"),
        sf.min("commit_time").alias("t0"),
        sf.max("commit_time").alias("t1"),
    ).first()
    seqs = sorted(r[0] for r in events.select("log_seq").distinct().collect())
    log_keys = events.select("log_key").distinct().count() if log_set else None
    logs = events.select("log_key", "log_seq").distinct().count() if log_set else len(seqs)
    keys = target = None
    if args.convention == "resource" or args.key:
        key = sf.expr(args.key) if args.key else None
        op = sf.expr(args.op) if args.op else None
        if log_set:
            # Each log as of its newest record, or of --as-of-time.
            live = state(events, key=key, op=op, as_of_time=args.as_of_time)
        else:
            target = resolve_lsn(events, args.as_of_lsn, args.as_of_time)
            live = state(events, key=key, op=op, as_of_lsn=target)
        logger.info("writing %s (state as of LSN %s)", state_path, target)
        live.write.mode(mode).parquet(state_path)
        keys = spark.read.parquet(state_path).count()
    corrupt = None
    if args.recovery == "skip":
        report = corrupt_report(
            spark, args.url, storage_options=storage_options or None, logs=args.logs, keyProvider=args.key_provider
        )
        report.write.mode(mode).parquet(f"{out}/_corrupt")
        corrupt = spark.read.parquet(f"{out}/_corrupt").filter(sf.col("kind") == "skipped").count()
    assert stats is not None
    return Summary(
        url=args.url,
        out=output.final,
        logs=seqs,
        records=int(stats["n"]),
        first_lsn=stats["lo"],
        last_lsn=stats["hi"],
        first_time=stats["t0"],
        last_time=stats["t1"],
        as_of_lsn=target,
        keys=keys,
        corrupt=corrupt,
        log_keys=log_keys,
        log_count=logs,
        as_of_time=args.as_of_time,
    )


def _advice(explained: str, url: str) -> str:
    """What to do about a failure Spark reported, after what it was."""
    if explained.startswith("CorruptLogError"):
        return (
            f"{explained}; `persistlog verify {url}` lists the damage, and --recovery skip replays "
            "around it (listing it in OUT/_corrupt)"
        )
    if explained.startswith("KeyUnavailableError"):
        return f"{explained}; --key-provider MODULE:CALLABLE names the key provider the writer used"
    return explained


def check_follow_args(args: argparse.Namespace) -> None:
    """Refuse what ``--follow`` cannot honour, before Spark starts."""
    if not args.follow:
        raise JobError("--checkpoint and --trigger are for --follow")
    if args.as_of_lsn is not None or args.as_of_time or args.key or args.op:
        raise JobError("--follow writes events/ only: state options (--as-of-*, --key, --op) are for a batch run")
    if args.logs != "all" or args.recovery != "strict" or args.overwrite:
        raise JobError("--follow takes neither --logs, --recovery skip nor --overwrite: it resumes from its checkpoint")
    if not args.trigger > 0:
        raise JobError(f"--trigger must be a positive number of seconds, not {args.trigger}")


def _stop_between_batches(spark: Any, query: Any, wait: float = 30.0) -> None:
    """Stop a query, after its micro-batch in flight if it ends within ``wait`` seconds.

    Spark stops a query by interrupting it: a batch cut short is redone by the next run
    (nothing is lost or written twice) but Spark logs the interruption with stack traces,
    which are noise here, so its logging is off while it stops.
    """
    import time

    deadline = time.monotonic() + wait
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.05)
    spark.sparkContext.setLogLevel("OFF")
    query.stop()


def follow(args: argparse.Namespace, spark: Any, stdout: TextIO) -> int:
    """``--follow``: ``events/`` as a streaming query that appends every new record, from
    the records a restore replays on, until interrupted. The checkpoint makes a rerun
    resume after the last record written, with none twice."""
    import json
    import signal
    import threading

    storage_options = parse_storage_options(args.storage_option)
    out = args.out.rstrip("/")
    checkpoint = args.checkpoint or f"{out}/_checkpoint"
    reader = spark.readStream.format("persistlog").option("convention", args.convention)
    if storage_options:
        reader = reader.option("storage_options", json.dumps(storage_options))
    if args.max_partition_bytes:
        reader = reader.option("max_partition_bytes", args.max_partition_bytes)
    if args.key_provider:
        reader = reader.option("keyProvider", args.key_provider)
    query = (
        reader.load(args.url)
        .writeStream.format("parquet")
        .partitionBy("log_seq")
        .option("path", f"{out}/events")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{args.trigger} seconds")
        .start()
    )
    stdout.write(f"following {args.url} into {out}/events (checkpoint {checkpoint}); Ctrl-C stops\n")
    stdout.flush()
    # Ctrl-C only raises a flag: an exception raised inside a call into the JVM (PySpark's
    # own handler) breaks the connection mid-call and buries the stop in stack traces.
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.set())
    try:
        while not interrupted.is_set() and not query.awaitTermination(0.5):
            pass
        if interrupted.is_set():
            _stop_between_batches(spark, query)
            stdout.write(f"stopped following {args.url}; rerun the same command to resume\n")
    finally:
        signal.signal(signal.SIGINT, previous)
    return EXIT_OK


def follow_main(args: argparse.Namespace, spark: Any, stdout: TextIO) -> int:
    """The job with ``--follow``: arguments checked before Spark starts, Spark's own log in
    a file as for a batch run, failures in one line, an interrupted start-up stopped
    without a trace."""
    spark_log: str | None = None
    keep_log = False
    try:
        check_follow_args(args)
        if _is_log_set(args.url, parse_storage_options(args.storage_option)):
            raise JobError(
                f"{args.url} is a log set: --follow (a stream) does not take a log set yet; follow one "
                "of its logs, or replay the set without --follow"
            )
        session = spark
        if session is None:
            if not args.verbose:
                spark_log = _new_spark_log()
            session = _session(spark_log)
        return follow(args, session, stdout)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return EXIT_INTERRUPTED
    except (JobError, ValueError) as e:
        sys.stderr.write(f"error: {e}\n")
        return e.code if isinstance(e, JobError) else EXIT_USAGE
    except Exception as e:
        if not type(e).__module__.startswith(("pyspark", "py4j")):
            raise
        logger.debug("Spark failure", exc_info=True)
        explained = _advice(_explain(e), args.url)
        if spark_log is not None:
            keep_log = True
            explained += f" (Spark's log: {spark_log})"
        sys.stderr.write(f"error: {explained}\n")
        return EXIT_FAILED
    finally:
        if spark_log is not None and not keep_log:
            os.unlink(spark_log)


def main(argv: list[str] | None = None, *, spark: Any = None, stdout: TextIO | None = None) -> int:
    """Run the job; returns the exit status. ``spark`` reuses an existing session."""
    args = build_parser().parse_args(argv)
    stdout = stdout or sys.stdout
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.ERROR if args.quiet else logging.WARNING,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        logging.getLogger("py4j").setLevel(logging.WARNING)
    if args.follow or args.checkpoint or args.trigger != 1.0:
        return follow_main(args, spark, stdout)
    output: Output | None = None
    spark_log: str | None = None
    keep_log = False
    own: Any = None  # the session this call started, if any
    try:
        prepared = prepare(args)
        output = prepared[1]
        if spark is None and not args.verbose:
            spark_log = _new_spark_log()
        try:
            if spark is None:
                spark = own = _session(spark_log)
            summary = run(args, spark, stdout, prepared)
            output.commit()
        except Exception as e:
            if not type(e).__module__.startswith(("pyspark", "py4j")):
                raise
            logger.debug("Spark failure", exc_info=True)
            explained = _advice(_explain(e), args.url)
            if spark_log is not None and not explained.startswith("CorruptLogError"):
                # An unexpected failure: the details are in Spark's own log.
                keep_log = True
                explained += f" (Spark's log: {spark_log})"
            raise JobError(explained, EXIT_FAILED) from None
    except JobError as e:
        sys.stderr.write(f"error: {e}\n")
        return e.code
    except ValueError as e:
        sys.stderr.write(f"error: {e}\n")
        return EXIT_USAGE
    finally:
        if own is not None:
            # Before a failed run's partial output is removed: the failed write's other
            # tasks may still be running, and one could write into it again afterwards.
            own.stop()
        if output is not None:
            output.discard()
        if spark_log is not None and not keep_log:
            os.unlink(spark_log)
    summary.print(stdout)
    return EXIT_OK
