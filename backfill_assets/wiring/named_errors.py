"""A named error (core/errors.py) leads what a person reads, not the end of a traceback.

Why: a wrong partition key given to `dagster job execute` ends a 30-frame Dagster traceback;
the one line that says what happened and what to do was the last one. The command-line
processes that load the definitions print a named error first and alone (the traceback only
on request: BACKFILL_TRACEBACK=1, read by resources/settings.py); every other exception keeps
Python's own report. Inside a run, the ops (`named_first`) fail their step with the named
error as its first line.
"""

from __future__ import annotations

import functools
import inspect
import sys
import traceback
from collections.abc import Callable
from types import TracebackType

import dagster as dg

from backfill_assets.core.errors import BackfillError

_SHOW = {"traceback": False}  # the process's setting (install)


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
    if _SHOW["traceback"]:
        traceback.print_exception(kind, exc, tb, file=sys.stderr)
    else:
        print("(the full traceback: BACKFILL_TRACEBACK=1)", file=sys.stderr)


def install(show_traceback: bool = False) -> None:
    """Print named errors first in this process (idempotent; another hook is left alone);
    `show_traceback`: the setting BACKFILL_TRACEBACK."""
    _SHOW["traceback"] = show_traceback
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _excepthook


def named_first(op_body: Callable) -> Callable:
    """An op body whose named error fails its step as `dg.Failure` led by the error's name and
    message (the cause kept below it), so a run's page and `dagster job execute` show what to
    do first, not Dagster's "Error occurred while executing op" over a long traceback."""
    if inspect.isgeneratorfunction(op_body):
        @functools.wraps(op_body)
        def generating(*args, **kwargs):
            try:
                yield from op_body(*args, **kwargs)
            except BackfillError as exc:
                raise dg.Failure(description=headline(exc)) from exc
        return generating

    @functools.wraps(op_body)
    def returning(*args, **kwargs):
        try:
            return op_body(*args, **kwargs)
        except BackfillError as exc:
            raise dg.Failure(description=headline(exc)) from exc
    return returning
