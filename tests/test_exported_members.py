"""Every module says what it exports, and exports only what exists and is public.

After httpx's `tests/test_exported_members.py`: `__all__` is the public API of a module, so a
name in it that does not exist (renamed, moved) or that is private (`_x`) is a defect a reader
of the module cannot see. Packages whose `__init__` only documents need none; the `gputopo.app`
shell (its commands are looked up by name) and the dashboard generator (a script) are exempt.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pytest

_PACKAGES = ("gputopo", "exporter", "aggregator", "scheduler", "dashboards")
_EXEMPT = ("gputopo.app", "gputopo.v1", "dashboards.generate")


def _modules() -> list[str]:
    names = []
    for package in _PACKAGES:
        root = importlib.import_module(package)
        names.append(package)
        names += [m.name for m in pkgutil.walk_packages(root.__path__, f"{package}.")]
    return sorted(n for n in names if not n.startswith(_EXEMPT) and not n.endswith(".__main__"))


MODULES = _modules()


def _public_definitions(module: ModuleType) -> list[str]:
    """Names a module defines itself that are not private and not submodules."""
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, ModuleType)
        and getattr(value, "__module__", module.__name__) == module.__name__
        and name != "annotations"  # from __future__
    ]


@pytest.mark.parametrize("name", MODULES)
def test_a_module_exports_only_public_names_that_exist(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    if exported is None:
        assert hasattr(module, "__path__"), f"{name}: a module without __all__"
        assert _public_definitions(module) == [], f"{name}: a package defining names, no __all__"
        return
    assert [x for x in exported if x.startswith("_") or not hasattr(module, x)] == []
    assert len(set(exported)) == len(exported)


def test_the_walk_found_the_modules() -> None:
    # Guards the test above against a walk that finds nothing and so checks nothing.
    assert {"gputopo.core", "gputopo.pods", "aggregator.service", "exporter.agent"} <= set(MODULES)
    assert len(MODULES) > 120
