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

from backfill_assets.core.errors import BackfillError, StoreUnavailable

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


def store_failure(exc: BaseException) -> BackfillError | None:
    """``StoreUnavailable`` for an object store that stopped answering mid-run: obstore's
    ``GenericError`` or pyarrow's S3 ``OSError`` (its message names the AWS error) in the
    chain of ``exc``. Why: such a run fails on whichever read or upload met the outage first,
    with the client's raw report; every commit is one create-only PUT, so the tables are whole
    and the named error can say so."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        kind = f"{type(exc).__module__}.{type(exc).__name__}"
        if kind == "obstore.exceptions.GenericError" or (
                isinstance(exc, OSError) and "AWS Error" in str(exc)):
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else kind
            return StoreUnavailable(
                f"the object store did not answer ({first}). Every commit is all or nothing, "
                "so the tables are whole: rerun once the store answers.")
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _failure(exc: Exception) -> dg.Failure | None:
    """The step failure that names ``exc`` (None: it keeps Python's own report)."""
    named = exc if isinstance(exc, BackfillError) else store_failure(exc)
    return None if named is None else dg.Failure(description=headline(named))


def named_first(op_body: Callable) -> Callable:
    """An op body whose named error (or an unreachable store's, ``store_failure``) fails its
    step as `dg.Failure` led by the error's name and message (the cause kept below it), so a
    run's page and `dagster job execute` show what to do first, not Dagster's "Error occurred
    while executing op" over a long traceback."""
    if inspect.isgeneratorfunction(op_body):
        @functools.wraps(op_body)
        def generating(*args, **kwargs):
            try:
                yield from op_body(*args, **kwargs)
            except Exception as exc:
                failure = _failure(exc)
                if failure is None:
                    raise
                raise failure from exc
        return generating

    @functools.wraps(op_body)
    def returning(*args, **kwargs):
        try:
            return op_body(*args, **kwargs)
        except Exception as exc:
            failure = _failure(exc)
            if failure is None:
                raise
            raise failure from exc
    return returning
