"""A registered class that changed since its records were logged: the app's
``CodecError``, never damage; versions and upgrade functions read the old records
(docs/FORMAT.md, "Records")."""

from __future__ import annotations

import dataclasses
import decimal
import subprocess
import sys
from typing import Any

import pytest

import persistlog


@dataclasses.dataclass
class Order:
    id: int
    total: decimal.Decimal


@dataclasses.dataclass
class OrderWithCurrency:
    id: int
    total: decimal.Decimal
    currency: str


@dataclasses.dataclass
class OrderWithoutTotal:
    id: int


@dataclasses.dataclass
class OrderRenamed:
    id: int
    amount: decimal.Decimal


def codec_for(cls: type, **options: Any) -> persistlog.Codec:
    codec = persistlog.Codec()
    codec.register("shop.Order", cls, **options)
    return codec


def write_orders(url: str, codec: persistlog.Codec, orders: list[Any]) -> None:
    log = persistlog.open(url, lambda emit: None, codec=codec)
    log.update({"plain": "before"})
    log.sync()
    for order in orders:
        log.update(order)
    log.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    "changed, field",
    [(OrderWithCurrency, "currency"), (OrderWithoutTotal, "total"), (OrderRenamed, "total")],
    ids=["field-added", "field-dropped", "field-renamed"],
)
@pytest.mark.parametrize("recovery", ["strict", "skip"])
def test_a_changed_class_is_the_apps_codec_error_never_damage(
    log_dir: str, changed: type, field: str, recovery: str
) -> None:
    write_orders(log_dir, codec_for(Order), [Order(1, decimal.Decimal("9.99"))])
    with pytest.raises(persistlog.CodecError) as info:
        persistlog.restore(log_dir, lambda r: None, codec=codec_for(changed), recovery=recovery)
    e = info.value
    assert not isinstance(e, persistlog.CorruptLogError)
    assert (e.type_name, e.version, e.lsn) == ("shop.Order", 1, 2)
    assert isinstance(e.__cause__, TypeError) and field in str(e.__cause__)
    assert "LSN 2" in str(e) and log_dir in str(e) and "not damage" in str(e)
    # The bytes are intact: verify says so.
    proc = subprocess.run([sys.executable, "-m", "persistlog", "verify", log_dir], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_follower_raises_the_codec_error_too(log_dir: str) -> None:
    write_orders(log_dir, codec_for(Order), [Order(1, decimal.Decimal("1"))])
    follower = persistlog.follow(log_dir, lambda r: None, codec=codec_for(OrderRenamed))
    with pytest.raises(persistlog.CodecError, match="'shop.Order'"):
        for _ in follower:
            pass
    follower.stop()


def test_upgrades_chain_from_the_version_a_record_was_written_with(tmp_path: Any) -> None:
    @dataclasses.dataclass
    class OrderV3:
        id: int
        amount: decimal.Decimal
        currency: str

    v1_url, v2_url = str(tmp_path / "v1"), str(tmp_path / "v2")
    write_orders(v1_url, codec_for(Order), [Order(1, decimal.Decimal("2.50"))])
    to_v2 = {1: lambda f: {"id": f["id"], "amount": f["total"]}}
    write_orders(v2_url, codec_for(OrderRenamed, version=2, upgrade=to_v2), [OrderRenamed(2, decimal.Decimal("3"))])
    v3 = codec_for(OrderV3, version=3, upgrade={**to_v2, 2: lambda f: {**f, "currency": "EUR"}})
    for url, expected in ((v1_url, OrderV3(1, decimal.Decimal("2.50"), "EUR")),
                          (v2_url, OrderV3(2, decimal.Decimal("3"), "EUR"))):
        read: list[Any] = []
        persistlog.restore(url, read.append, codec=v3)
        assert read == [{"plain": "before"}, expected]


def test_a_record_newer_than_the_codec_is_refused_by_name(log_dir: str) -> None:
    v2 = codec_for(OrderWithCurrency, version=2, upgrade={1: lambda f: {**f, "currency": "EUR"}})
    write_orders(log_dir, v2, [OrderWithCurrency(1, decimal.Decimal("1"), "USD")])
    with pytest.raises(persistlog.CodecError, match="written by version 2; this Codec registers version 1"):
        persistlog.restore(log_dir, lambda r: None, codec=codec_for(Order))
    # Without the registration it stays the inert tag, as any unknown type does.
    read: list[Any] = []
    persistlog.restore(log_dir, read.append)
    tag = read[1]
    assert tag.tag == 27 and tag.value[0] == "shop.Order" and tag.value[2] == 2


def test_an_upgrade_that_raises_is_the_codec_error_with_its_cause(log_dir: str) -> None:
    write_orders(log_dir, codec_for(Order), [Order(1, decimal.Decimal("1"))])

    def bad(fields: Any) -> Any:
        raise KeyError("currency")

    with pytest.raises(persistlog.CodecError) as info:
        persistlog.restore(log_dir, lambda r: None, codec=codec_for(OrderWithCurrency, version=2, upgrade={1: bad}))
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"version": 0}, "version must be an integer >= 1"),
        ({"version": 2}, r"missing \[1\]"),
        ({"version": 2, "upgrade": {1: lambda f: f, 2: lambda f: f}}, r"unexpected \[2\]"),
        ({"version": 2, "upgrade": {1: "not callable"}}, "needs upgrade="),
    ],
)
def test_register_refuses_versions_without_their_upgrades(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        persistlog.Codec().register("shop.Order", Order, **options)
