"""The PySpark Python Data Source named ``persistlog``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from ._options import STREAM_KNOWN, ReadOptions, StreamOptions
from ._schema import ddl


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
        return ddl(opts.view, opts.convention)

    def reader(self, schema: StructType) -> DataSourceReader:
        return PersistLogReader(self._options())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from ._stream import PersistLogStreamReader

        return PersistLogStreamReader(StreamOptions.parse(self.options))


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
        from ._plan import LogPartition
        from ._scan import reader_for

        if not isinstance(partition, LogPartition):
            # Spark reads one placeholder partition when planning found no log at all.
            return iter(())
        return reader_for(self.opts.view)(partition)
