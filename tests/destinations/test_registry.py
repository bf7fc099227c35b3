"""open_destination(), register() and available(): choosing a driver from a URL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import destinations
from destinations import available, open_destination, register
from destinations.local import LocalDestination
from destinations.objectstore import ObjectStoreDestination


def test_all_is_sorted_and_complete() -> None:
    assert destinations.__all__ == sorted(destinations.__all__)
    public = {n for n in vars(destinations) if not n.startswith("_")}
    internals = {"annotations", "Any", "driver_for", "split_protocol", "with_hint"}
    modules = {"local", "objectstore"}
    assert set(destinations.__all__) == public - internals - modules


def test_registry_is_alphabetical_and_read_only() -> None:
    from destinations import _registry

    assert list(_registry._BUILTIN) == sorted(_registry._BUILTIN)
    view = available()
    with pytest.raises(TypeError):
        view["evil"] = "x:Y"  # type: ignore[index]
    assert view["s3"] == view["memory"] == "destinations.objectstore:ObjectStoreDestination"
    assert view["file"] == "destinations.local:LocalDestination"


@pytest.mark.parametrize("form", ["{p}", "file://{p}", "local://{p}", "{p}/", "FILE://{p}"])
def test_local_urls(tmp_path: Path, form: str) -> None:
    dest = open_destination(form.format(p=tmp_path / "log"))
    assert isinstance(dest, LocalDestination)
    assert dest.path == str(tmp_path / "log")


def test_relative_path_is_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    dest = open_destination("rel/log")
    assert isinstance(dest, LocalDestination)
    assert dest.path == str(tmp_path / "rel" / "log")


def test_object_store_urls_keep_their_options(clean_memory_fs: None) -> None:
    dest = open_destination("memory://bucket/log")
    assert isinstance(dest, ObjectStoreDestination)
    assert dest.storage_options == {}
    options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}
    s3 = open_destination("S3://bucket/log", **options)
    assert isinstance(s3, ObjectStoreDestination)
    assert s3.storage_options == options
    assert s3.fs.key == "k"  # passed untouched to fsspec
    assert s3.root == "bucket/log"


def test_other_fsspec_protocols_get_the_generic_driver() -> None:
    # "dir" needs options, "github" a network: "tar"/"zip" have a deterministic failure.
    with pytest.raises((ValueError, TypeError, FileNotFoundError, OSError)):
        open_destination("zip://inner/log")  # ObjectStoreDestination, but no zip file given
    from destinations._registry import driver_for

    cls, _ = driver_for("gcs")
    assert cls is ObjectStoreDestination


def test_missing_dependency_gives_an_install_hint() -> None:
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="gcsfs"):
            open_destination("gcs://bucket/log")
    else:  # pragma: no cover - gcsfs is not in the test environment
        pytest.skip("gcsfs is installed")


@pytest.mark.parametrize(
    ("url", "suggestion"), [("s4://b/x", "s3"), ("memroy://x", "memory"), ("fiel:///tmp/x", "file")]
)
def test_unknown_protocol_suggests_the_nearest(url: str, suggestion: str) -> None:
    with pytest.raises(ValueError) as info:
        open_destination(url)
    message = str(info.value)
    assert repr(url.split("://")[0]) in message
    assert f"did you mean {suggestion}://" in message
    assert "memory, s3" in message  # lists the registered protocols


def test_bad_urls() -> None:
    for url in ["", "simplecache::s3://b/x"]:
        with pytest.raises(ValueError):
            open_destination(url)


def test_register_a_driver(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        register("plugin", "no_colon_here")
    register("conformance-plugin", "destinations.local:LocalDestination")
    register("conformance-plugin", "destinations.local:LocalDestination")  # same target: fine
    with pytest.raises(ValueError, match="clobber"):
        register("conformance-plugin", "destinations.objectstore:ObjectStoreDestination")
    assert available()["conformance-plugin"] == "destinations.local:LocalDestination"
    dest = open_destination(f"conformance-plugin://{tmp_path}")
    assert isinstance(dest, LocalDestination)
    assert dest.path == str(tmp_path)


def test_unimportable_driver_reraises_with_hint() -> None:
    register("broken-plugin", "no_such_module_anywhere:Driver", "install the broken extra")
    with pytest.raises(ImportError, match="install the broken extra"):
        open_destination("broken-plugin://x")


def test_never_imports_the_layers_above() -> None:
    code = (
        "import sys, destinations, destinations.local, destinations.objectstore\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('persistlog', 'spark_replay')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
