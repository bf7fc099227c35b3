"""The hypothesis profiles of the persistlog tests.

PERSISTLOG_HYPOTHESIS_PROFILE picks one (default "ci": the property tests take a few tens of
seconds; "thorough" is a soak). Applied per test, never loaded globally, so other packages'
hypothesis tests keep their own settings.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings

_COMMON: dict[str, Any] = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("ci", max_examples=25, stateful_step_count=30, **_COMMON)
settings.register_profile("thorough", max_examples=400, stateful_step_count=60, **_COMMON)


def active_profile(**ci: Any) -> settings:
    """The active persistlog hypothesis profile; ``ci`` overrides apply to the "ci" one
    (a test's own budget for CI), never to a soak profile."""
    name = os.environ.get("PERSISTLOG_HYPOTHESIS_PROFILE", "ci")
    profile = settings.get_profile(name)
    return settings(profile, **ci) if name == "ci" else profile
