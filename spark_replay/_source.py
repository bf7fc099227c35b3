"""The PySpark Python Data Source named ``persistlog``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from ._options import STREAM_KNOWN, ReadOptions, StreamOptions
from ._schema import LOG_KEY_FIELD, ddl


class PersistLogDataSource(DataSource):
    """``spark.read.format("persistlog").option(...).load(url)``: one row per record.

    Register it with :func:`spark_replay.register`. See the package docstring for the
    options and the columns.
    """

    @classmethod
    def name(cls) -> str:
        return "persistlog"

    def _options(self) -> ReadOptions:
        return ReadOptions.parse(self.options)

    def schema(self) -> str:
        # Asked for batch reads and streams alike; streamReader() checks the stream's options.
        opts = ReadOptions.parse(self.options, ignore=STREAM_KNOWN)
        return ddl(opts.view, opts.convention, is_log_set(opts))

    def reader(self, schema: StructType) -> DataSourceReader:
        # The schema says what schema() found at the URL: a log set's rows carry log_key.
        return PersistLogReader(replace(self._options(), log_set=LOG_KEY_FIELD[0] in schema.fieldNames()))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from ._stream import PersistLogStreamReader

        opts = StreamOptions.parse(self.options)
        if LOG_KEY_FIELD[0] in schema.fieldNames():
            raise ValueError(
                f"{opts.read.url} is a log set: streaming a log set is not supported yet; stream "
                "one of its logs (LogSet.url(key)), or read the set as a batch"
            )
        return PersistLogStreamReader(opts)


def is_log_set(opts: ReadOptions) -> bool:
    """Whether ``opts.url`` is the root of a log set (its ``LOGSET`` marker): one small
    read, a failed one for a log."""
    from persistlog.reading import read_log_set_marker

    return read_log_set_marker(opts.url, opts.storage_options) is not None


class PersistLogReader(DataSourceReader):
    """Plans partitions on the driver and reads them on the executors."""

    def __init__(self, options: ReadOptions) -> None:
        self.opts = options

    def partitions(self) -> Sequence[InputPartition]:
        from ._plan import plan

        opts = self.opts
        if opts.view == "corrupt":
            # The report must see every problem rather than stop at the first.
            opts = replace(opts, recovery="skip")
        return plan(opts)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from ._plan import LogPartition, SetPartition
        from ._scan import reader_for

        if isinstance(partition, SetPartition):
            from ._scan import read_set

            return read_set(partition, self.opts.view)
        if not isinstance(partition, LogPartition):
            # Spark reads one placeholder partition when planning found no log at all.
            return iter(())
        return reader_for(self.opts.view)(partition)
