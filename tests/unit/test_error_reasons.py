"""Every ErrorInfo reason belongs to exactly one exception class, so a client rebuilding
an error from its reason (quarry.runtime.errors.from_rpc_error) gets a definite class."""

import importlib
import pkgutil

import quarry
from quarry import errors


def _all_subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def test_reasons_are_unique_and_upper_snake_case():
    for module in pkgutil.walk_packages(quarry.__path__, "quarry."):
        if module.name.startswith(("quarry.spark", "quarry.v1")):
            continue
        importlib.import_module(module.name)
    owners: dict[str, type] = {}
    for cls in _all_subclasses(errors.QuarryError):
        if cls.__module__.startswith("tests") or "test" in cls.__module__:
            continue
        assert cls.reason.isupper() and " " not in cls.reason, cls
        other = owners.setdefault(cls.reason, cls)
        assert other is cls, f"{cls.reason}: {other.__module__}.{other.__name__} and " \
                             f"{cls.__module__}.{cls.__name__}"
