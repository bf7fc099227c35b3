"""The read path, public: what a reader of logs needs beside :func:`persistlog.restore`,
:func:`persistlog.read` and :func:`persistlog.follow`.

A tool that reads logs itself (the Spark source in ``spark_replay``, the ``persistlog``
CLI, a DuckDB or Flink reader) takes everything from here and from ``persistlog``, never
from persistlog's underscore modules, which may change at any release. Every name below
is typed (``mypy --strict``) and documented where it is defined; the bytes are in
``docs/FORMAT.md``. A destination comes from ``destinations.open_destination(url,
**storage_options)``.

Finding logs
    ``list_logs`` (the logs of a destination and their segments, from one listing),
    ``list_logs_sized`` (the same and each segment's size, from the same listing: no
    request per segment on S3),
    ``read_pointer`` (the log ``CURRENT`` names), ``replay_plan`` and ``ReplayPlan`` (the
    logs a restore replays, and whether the first holds a complete snapshot),
    ``why_no_log`` (what a location that holds no log holds instead, for an error message),
    ``no_log`` (the ``LogNotFoundError`` that says it, with the reader's advice),
    ``read_log_set_marker`` (the depth of the log set at a root, None for no set; its keys
    and logs are ``persistlog.LogSet.logs``), ``segment_name`` and ``parse_segment_name``
    (segment names), ``CURRENT_NAME``, ``LOG_SET_NAME`` (the marker at a log set's root).

Scanning a log
    ``LogScanner`` (every batch of one log, every byte and the LSN and hash chains
    checked, damage classified as restore classifies it; ``RECOVERY_MODES``), ``Batch``,
    ``BatchHeader``, ``LogState`` (what a scan learned), ``ScanStart`` (where a scan
    resumes), ``SegmentBytes`` (a window over one segment), ``walk_headers`` and
    ``HeaderWalk`` (batch headers only: first LSN, the log's header, the complete marker,
    batch offsets; ``WALK_CHUNK``), ``declares_gap`` (whether a log's header says it
    follows a gap).

Decoding by hand
    ``parse_segment_header`` and ``SegmentHeader``, ``parse_batch_header``,
    ``check_payload`` (checksum, decryption, decompression), ``control_records``,
    ``plain_loads`` (CBOR without a Codec), ``Damage`` (what is wrong with the bytes, and
    where), ``head_after`` (the chain head after one whole batch: its SHA-256, for a
    reader that takes up the hash chain where it stopped). Format constants:
    ``FIRST_LSN``, ``SEGMENT_HEADER_SIZE``, ``BATCH_HEADER_SIZE``, ``KIND_UPDATE``,
    ``KIND_SNAPSHOT``, ``KIND_CONTROL``, ``CONTROL_COMPLETE``, ``CONTROL_CHECKPOINT``,
    ``CONTROL_SEAL``, ``CONTROL_FENCE``, ``HEADER_AFTER_GAP``, ``SEAL_CHAIN``.

Gaps, damage and retention
    ``Skipped`` (damage passed over in ``"skip"`` mode; a crash's unfinished end, dropped,
    is a ``persistlog.TornTail``), ``SegmentGone`` (a segment not there), ``retention_gap``
    and ``RetentionGap`` (gone because retention deleted it), ``outrun`` and
    ``RESYNC_ATTEMPTS`` (a reader retention keeps overtaking), ``gone_since`` (whether
    what a ``ReplayPlan`` listed is being deleted: a segment gone since, or damage in a
    log that CURRENT has moved past since the plan read it), ``gap_closed`` (whether a
    declared gap is behind a reader), ``first_lsn`` (the first LSN of a segment).

Positions and following
    ``seek`` (where an LSN or a time is: ``LogView``, ``Place``), ``utc_micros``,
    ``SegmentProbe`` and ``next_segments`` (the names that can come next, probed without
    a listing). ``persistlog.Cursor`` is a position.

Records as text
    ``to_json`` (the lossless rule of ``docs/JSON.md``) and ``from_json`` (its inverse),
    ``JsonRecords`` and ``PlainRecords`` (the same, decoded in C), ``texts_from_cbor`` and
    ``resource_texts_from_cbor`` (JSON text straight from CBOR bytes), ``key_text``.

Keys of encrypted logs
    ``Keyring``, ``provider_named`` (a key provider by its ``MODULE:CALLABLE`` name),
    ``OPAQUE`` (structure-only reads: payloads stay shut).

Long reads
    ``gc_pause`` (``with gc_pause.during_replay():`` pauses the cyclic GC, as a restore
    does).

Checking and repairing a destination
    ``inspect_destination`` and ``DestinationReport`` (what ``persistlog info`` and
    ``verify`` report: ``Problem``, ``SignedHead``, ``Progress``, ``Holder``), ``audit``,
    ``Audit`` and ``Verifier`` (signed chain heads checked with a public key, read by
    ``load_public_key``), ``repair``, ``RepairPlan`` and ``RepairResult`` (cutting a torn
    tail: the one call here that writes).

Command lines
    ``parse_storage_options`` (``--storage-option KEY=VALUE`` words) and ``UsageError``.
"""

from __future__ import annotations

from ._apps.log_set import read_marker as read_log_set_marker
from ._format.chain import head_after
from ._format.codec import plain_loads
from ._format.constants import (
    BATCH_HEADER_SIZE,
    CONTROL_CHECKPOINT,
    CONTROL_COMPLETE,
    CONTROL_FENCE,
    CONTROL_SEAL,
    CURRENT_NAME,
    FIRST_LSN,
    HEADER_AFTER_GAP,
    KIND_CONTROL,
    KIND_SNAPSHOT,
    KIND_UPDATE,
    LOG_SET_NAME,
    SEAL_CHAIN,
    SEGMENT_HEADER_SIZE,
    parse_segment_name,
    segment_name,
)
from ._format.crypt import OPAQUE, Keyring, provider_named
from ._format.decoder import (
    BatchHeader,
    Damage,
    SegmentHeader,
    check_payload,
    control_records,
    parse_batch_header,
    parse_segment_header,
)
from ._format.jsonify import (
    JsonRecords,
    PlainRecords,
    from_json,
    key_text,
    resource_texts_from_cbor,
    texts_from_cbor,
    to_json,
)
from ._format.signing import Verifier, load_public_key
from ._inspect.audit import Audit, audit
from ._inspect.destination_check import inspect_destination
from ._inspect.destination_report import DestinationReport, Problem, Progress, SignedHead
from ._inspect.repair import RepairPlan, RepairResult, repair
from ._read.follower import first_lsn, gap_closed
from ._read.probe import SegmentProbe, next_segments
from ._read.reader import (
    RECOVERY_MODES,
    RESYNC_ATTEMPTS,
    WALK_CHUNK,
    Batch,
    HeaderWalk,
    LogScanner,
    LogState,
    RetentionGap,
    ScanStart,
    SegmentBytes,
    SegmentGone,
    Skipped,
    declares_gap,
    list_logs,
    list_logs_sized,
    no_log,
    outrun,
    read_pointer,
    retention_gap,
    walk_headers,
    why_no_log,
)
from ._read.restore import ReplayPlan, gc_pause, gone_since
from ._read.restore import plan as replay_plan
from ._read.seek import LogView, Place, seek, utc_micros
from ._usage import UsageError, parse_storage_options
from ._write.lock_holder import Holder

__all__ = [
    "Audit",
    "BATCH_HEADER_SIZE",
    "Batch",
    "BatchHeader",
    "CONTROL_CHECKPOINT",
    "CONTROL_COMPLETE",
    "CONTROL_FENCE",
    "CONTROL_SEAL",
    "CURRENT_NAME",
    "Damage",
    "DestinationReport",
    "FIRST_LSN",
    "HEADER_AFTER_GAP",
    "HeaderWalk",
    "Holder",
    "JsonRecords",
    "KIND_CONTROL",
    "KIND_SNAPSHOT",
    "KIND_UPDATE",
    "Keyring",
    "LOG_SET_NAME",
    "LogScanner",
    "LogState",
    "LogView",
    "OPAQUE",
    "Place",
    "PlainRecords",
    "Problem",
    "Progress",
    "RECOVERY_MODES",
    "RESYNC_ATTEMPTS",
    "RepairPlan",
    "RepairResult",
    "ReplayPlan",
    "RetentionGap",
    "SEAL_CHAIN",
    "SEGMENT_HEADER_SIZE",
    "ScanStart",
    "SegmentBytes",
    "SegmentGone",
    "SegmentHeader",
    "SegmentProbe",
    "SignedHead",
    "Skipped",
    "UsageError",
    "Verifier",
    "WALK_CHUNK",
    "audit",
    "check_payload",
    "control_records",
    "declares_gap",
    "first_lsn",
    "from_json",
    "gap_closed",
    "gc_pause",
    "gone_since",
    "head_after",
    "inspect_destination",
    "key_text",
    "list_logs",
    "list_logs_sized",
    "load_public_key",
    "next_segments",
    "no_log",
    "outrun",
    "parse_batch_header",
    "parse_segment_header",
    "parse_segment_name",
    "parse_storage_options",
    "plain_loads",
    "provider_named",
    "read_log_set_marker",
    "read_pointer",
    "repair",
    "replay_plan",
    "resource_texts_from_cbor",
    "retention_gap",
    "seek",
    "segment_name",
    "texts_from_cbor",
    "to_json",
    "utc_micros",
    "walk_headers",
    "why_no_log",
]
