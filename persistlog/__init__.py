"""persistlog: a write-ahead persistence log for Python applications that keep their state
in memory.

::

    state = {}
    persistlog.restore(url, replay=apply)            # rebuild the state
    log = persistlog.open(url, enumerate_all=dump)   # start a fresh, complete log
    log.update({"op": "put", "key": k, "value": v})  # before each change is applied

See README.md for the guarantees of each durability mode and docs/FORMAT.md for the bytes.
"""

from ._aio.async_log import AsyncLog, open_async, restore_async
from ._api import OpenOptions, StoreOptions, restore
from ._api import open_log as open
from ._apps.log_set import LogSet, LogSetOptions
from ._apps.message_queue import Message, Queue
from ._apps.store import ResourceStore
from ._errors import (
    CodecError,
    CorruptLogError,
    DestinationError,
    EnumerateError,
    EnumerationStalled,
    ExistingLogError,
    HandedOver,
    KeyUnavailableError,
    LogClosedError,
    LogFailedError,
    LogNotFoundError,
    LogSetError,
    MissingDependencyError,
    PersistLogError,
    PositionError,
    QuotaExceeded,
    ResetRequired,
    WriterConflict,
)
from ._format.codec import Codec
from ._format.constants import SEGMENT_VERSIONS
from ._format.constants import WRITTEN_VERSION as FORMAT_VERSION
from ._read.consumers import Consumer, ConsumerGroup, consumers
from ._read.cursor import Cursor
from ._read.follower import FollowedBatch, Follower, Lag, follow
from ._read.records_between import LoggedRecord, read
from ._read.reader import TornTail
from ._read.restore import RestoreResult
from ._version import package_version
from ._write.log import Log
from ._write.rotation import Emit
from ._write.secondaries import SecondaryLag

#: The installed package's version. ``FORMAT_VERSION`` is the format version new logs are
#: written in with the default options; ``SEGMENT_VERSIONS`` every version this package reads.
__version__ = package_version()
del package_version

__all__ = [
    "AsyncLog",
    "Codec",
    "CodecError",
    "Consumer",
    "ConsumerGroup",
    "CorruptLogError",
    "Cursor",
    "DestinationError",
    "Emit",
    "EnumerateError",
    "EnumerationStalled",
    "ExistingLogError",
    "FORMAT_VERSION",
    "FollowedBatch",
    "Follower",
    "HandedOver",
    "KeyUnavailableError",
    "Lag",
    "Log",
    "LogClosedError",
    "LogFailedError",
    "LogNotFoundError",
    "LogSet",
    "LogSetError",
    "LogSetOptions",
    "LoggedRecord",
    "Message",
    "MissingDependencyError",
    "OpenOptions",
    "PersistLogError",
    "PositionError",
    "Queue",
    "QuotaExceeded",
    "ResetRequired",
    "ResourceStore",
    "RestoreResult",
    "SEGMENT_VERSIONS",
    "SecondaryLag",
    "StoreOptions",
    "TornTail",
    "WriterConflict",
    "consumers",
    "follow",
    "open",
    "open_async",
    "read",
    "restore",
    "restore_async",
]

for _name in __all__:
    _obj = globals()[_name]
    if hasattr(_obj, "__module__") and not isinstance(_obj, int):
        try:
            _obj.__module__ = "persistlog"
        except (AttributeError, TypeError):
            pass
del _name, _obj
