"""Shared test configuration."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# The real kube-apiserver + etcd harness (fixtures `kube_apiserver`, `kube_scope`).
pytest_plugins = ["tests.harness.kube_fixtures"]

# CI machines are small and shared: property tests get fewer examples and no deadline there.
settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
