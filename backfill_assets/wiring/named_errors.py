"""A named error (core/errors.py) leads what a person reads, not the end of a traceback.

Why: a wrong partition key given to `dagster job execute` ends a 30-frame Dagster traceback;
the one line that says what happened and what to do was the last one. The command-line
processes that load the definitions print a named error first and alone (the traceback only
on request: BACKFILL_TRACEBACK=1); every other exception keeps Python's own report.
"""

from __future__ import annotations

import os
import sys
import traceback
from types import TracebackType

from backfill_assets.core.errors import BackfillError

TRACEBACK_ENV = "BACKFILL_TRACEBACK"


def named_cause(exc: BaseException | None) -> BackfillError | None:
    """The first named error in the chain of `exc` (raised, or the cause of what was)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, BackfillError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def headline(error: BackfillError) -> str:
    return f"{type(error).__name__}: {error}"


def _excepthook(kind: type[BaseException], exc: BaseException,
                tb: TracebackType | None) -> None:
    named = named_cause(exc)
    if named is None:
        sys.__excepthook__(kind, exc, tb)
        return
    print(f"error: {headline(named)}", file=sys.stderr)
    if os.environ.get(TRACEBACK_ENV) == "1":
        traceback.print_exception(kind, exc, tb, file=sys.stderr)
    else:
        print(f"(the full traceback: {TRACEBACK_ENV}=1)", file=sys.stderr)


def install() -> None:
    """Print named errors first in this process (idempotent; another hook is left alone)."""
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _excepthook
