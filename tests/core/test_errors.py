"""The named errors: one flat list under BackfillError, so callers can catch by name."""

from __future__ import annotations

import inspect

from backfill_assets.core import errors

CORE_ERRORS = {
    "InvalidKeyType", "InvalidKeyValue", "ProgressSchemaMismatch", "CorruptProgressRow",
    "InvalidProgressTransition", "InconsistentSharedPosition", "InvalidMVDefinition",
    "InvalidControl", "InvalidVnode", "InvalidSnapshotChunk",
}


def test_every_error_is_a_backfill_error() -> None:
    classes = {n: c for n, c in inspect.getmembers(errors, inspect.isclass)
               if c.__module__ == errors.__name__}
    assert CORE_ERRORS <= set(classes)
    assert issubclass(errors.BackfillError, Exception)
    for name, cls in classes.items():
        assert issubclass(cls, errors.BackfillError), name


def test_core_errors_say_what_they_name() -> None:
    for name in CORE_ERRORS:
        assert getattr(errors, name).__doc__, name


def test_core_errors_are_siblings() -> None:
    for name in CORE_ERRORS:
        assert getattr(errors, name).__bases__ == (errors.BackfillError,)
