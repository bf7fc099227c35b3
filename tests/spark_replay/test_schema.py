"""One schema, three places: the DDL Spark is told, the Arrow batches ``read()`` builds, and
the column table of README.md. Each test holds two of them to each other."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import pytest

import persistlog
from spark_replay import _schema

README = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")

# How README names each Arrow type (Spark's own type names).
_README_TYPES = {"int64": "bigint", "string": "string", "timestamp[us, tz=UTC]": "timestamp"}


def readme_columns() -> list[tuple[str, str, str]]:
    """``(name, type, description)`` of each row of README's column table."""
    rows = re.findall(r"^\| `(\w+)`\s*\| `(\w+)`\s*\| (.*?) \|$", README, re.M)
    assert rows, "README.md has no column table"
    return rows


def test_readme_lists_every_column_in_order_with_its_type() -> None:
    documented = [(name, kind) for name, kind, _ in readme_columns()]
    expected = [(n, _README_TYPES[str(t)]) for n, t, _ in _schema.fields("records", "resource", log_set=True)]
    assert documented == expected


def test_readme_marks_log_key_as_a_log_set_column() -> None:
    for name, _kind, text in readme_columns():
        assert (name == "log_key") == text.startswith("log sets only"), name


def test_readme_marks_the_resource_columns_as_such() -> None:
    resource = {n for n, _t, _ in _schema.RESOURCE_FIELDS}
    for name, _kind, text in readme_columns():
        assert (name in resource) == text.startswith('`convention="resource"` only'), name


@pytest.mark.spark
@pytest.mark.parametrize("log_set", [False, True])
@pytest.mark.parametrize("convention", ["raw", "resource"])
def test_ddl_and_arrow_schema_are_the_same_struct(spark: Any, convention: str, log_set: bool) -> None:
    from pyspark.sql.pandas.types import from_arrow_schema

    told = spark.createDataFrame([], _schema.ddl("records", convention, log_set)).schema
    built = from_arrow_schema(_schema.arrow_schema("records", convention, log_set))
    assert [(f.name, f.dataType, f.nullable) for f in told] == [(f.name, f.dataType, f.nullable) for f in built]


@pytest.mark.spark
@pytest.mark.parametrize("convention", ["raw", "resource"])
def test_a_read_yields_the_schema_it_declares(spark: Any, tmp_path: pathlib.Path, convention: str) -> None:
    from pyspark.sql.pandas.types import from_arrow_schema

    url = str(tmp_path / "log")
    with persistlog.ResourceStore.open(url) as store:
        store["user:1"] = {"n": 1}
        store["user:2"] = [1, 2.5, None]
        del store["user:1"]
    df = spark.read.format("persistlog").option("convention", convention).load(url)
    expected = from_arrow_schema(_schema.arrow_schema("records", convention))
    assert [(f.name, f.dataType) for f in df.schema] == [(f.name, f.dataType) for f in expected]
    rows = df.orderBy("lsn").collect()
    assert [r["kind"] for r in rows] == ["update", "update", "update"]
    if convention == "resource":
        assert [(r["op"], r["key"]) for r in rows] == [("put", "user:1"), ("put", "user:2"), ("del", "user:1")]
