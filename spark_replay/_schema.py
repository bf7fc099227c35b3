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

HEADS_FIELDS: list[tuple[str, pa.DataType, bool]] = [
    ("log_seq", pa.int64(), False),
    ("segment", pa.int64(), False),
    ("offset", pa.int64(), False),
    ("kind", pa.string(), False),
    ("lsn", pa.int64(), False),
    ("head", pa.string(), False),
    ("key", pa.string(), False),
]

#: First of every row read from a log set: the key of the log holding it (absent for a log).
LOG_KEY_FIELD: tuple[str, pa.DataType, bool] = ("log_key", pa.string(), False)

_DDL = {pa.int64(): "BIGINT", pa.string(): "STRING", TIMESTAMP: "TIMESTAMP"}


def fields(view: str, convention: str, log_set: bool = False) -> list[tuple[str, pa.DataType, bool]]:
    key = [LOG_KEY_FIELD] if log_set else []
    if view == "corrupt":
        return key + CORRUPT_FIELDS
    if view == "heads":
        return key + HEADS_FIELDS
    return key + RECORD_FIELDS + (RESOURCE_FIELDS if convention == "resource" else [])


def arrow_schema(view: str, convention: str, log_set: bool = False) -> pa.Schema:
    return pa.schema([pa.field(n, t, nullable) for n, t, nullable in fields(view, convention, log_set)])


def ddl(view: str, convention: str, log_set: bool = False) -> str:
    """The schema as a Spark DDL string."""
    return ", ".join(
        f"{n} {_DDL[t]}{'' if nullable else ' NOT NULL'}" for n, t, nullable in fields(view, convention, log_set)
    )
