"""The columns each view of the data source yields, for Spark (DDL) and for Arrow.

Kept in one place so that the schema Spark is told and the batches ``read()`` builds cannot
drift apart (``tests/spark_replay/test_schema.py`` checks the two against each other).
"""

from __future__ import annotations

import pyarrow as pa

TIMESTAMP = pa.timestamp("us", tz="UTC")

RECORD_FIELDS: list[tuple[str, pa.DataType, bool]] = [
    ("log_seq", pa.int64(), False),
    ("segment", pa.int64(), False),
    ("lsn", pa.int64(), False),
    ("commit_time", TIMESTAMP, False),
    ("kind", pa.string(), False),
    ("record", pa.string(), False),
    ("base_log", pa.int64(), True),
]

RESOURCE_FIELDS: list[tuple[str, pa.DataType, bool]] = [
    ("op", pa.string(), True),
    ("key", pa.string(), True),
    ("key_json", pa.string(), True),
    ("value", pa.string(), True),
]

CORRUPT_FIELDS: list[tuple[str, pa.DataType, bool]] = [
    ("log_seq", pa.int64(), False),
    ("segment", pa.int64(), True),
    ("segment_name", pa.string(), True),
    ("offset", pa.int64(), True),
    ("length", pa.int64(), True),
    ("kind", pa.string(), False),
    ("reason", pa.string(), False),
]

_DDL = {pa.int64(): "BIGINT", pa.string(): "STRING", TIMESTAMP: "TIMESTAMP"}


def fields(view: str, convention: str) -> list[tuple[str, pa.DataType, bool]]:
    if view == "corrupt":
        return CORRUPT_FIELDS
    return RECORD_FIELDS + (RESOURCE_FIELDS if convention == "resource" else [])


def arrow_schema(view: str, convention: str) -> pa.Schema:
    return pa.schema([pa.field(n, t, nullable) for n, t, nullable in fields(view, convention)])


def ddl(view: str, convention: str) -> str:
    """The schema as a Spark DDL string."""
    return ", ".join(
        f"{n} {_DDL[t]}{'' if nullable else ' NOT NULL'}" for n, t, nullable in fields(view, convention)
    )
