import signal
from collections.abc import Iterator

import pytest
from crashsim import quiet_crash_threads

# --- destinations fixtures (moto S3 server, clean memory://): see tests/conftest_s3.py ---
from conftest_s3 import clean_memory_fs, moto_server, s3_bucket, s3_requests, s3_storage_options  # noqa: E402,F401


@pytest.fixture(autouse=True)
def _dead_threads_are_quiet() -> Iterator[None]:
    """Threads of a simulated dead process (tests/crashsim.py) end with SimulatedCrash, in
    any test that simulates a crash, and may do so after the crash itself returned;
    anything else a thread raises is still reported (and fails the test under
    filterwarnings=error)."""
    with quiet_crash_threads():
        yield


def pytest_configure(config: pytest.Config) -> None:
    """A suite started in the background by a non-interactive shell (``make test &``, a
    CI step) inherits SIGINT ignored, and so would every child it starts: the tests that
    Ctrl-C a child would then wait on a child that never sees it. SIGINT gets Python's
    own handler here; a child's exec then starts it at the default, as from a terminal."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


#: Fixtures that start (or share) the run's local Spark session.
SPARK_FIXTURES = frozenset({"spark", "shared_spark"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that asks for the Spark session carries the ``spark`` marker, so that
    ``-m "not spark"`` (``make check``) leaves out every test that starts Spark."""
    unmarked = [
        item.nodeid
        for item in items
        if SPARK_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("spark") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "tests that use the Spark session must be marked @pytest.mark.spark: " + ", ".join(unmarked)
        )
