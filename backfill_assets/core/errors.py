"""Every named, user-facing exception of the platform.

Why a flat list: callers (Dagster ops, the CLI, tests) catch by name and show the message,
which always says what to do. Adapters add their classes here, next to the core's ones, so
there is one place to look. The raise site writes the message; a class only names the case.
"""

from __future__ import annotations


class BackfillError(Exception):
    """Base of every error a user can cause; the message says what to do."""


class InvalidKeyType(BackfillError):
    """A primary-key column has a type the key order cannot compare or render as SQL."""


class InvalidKeyValue(BackfillError):
    """A key value has the wrong number of columns or a value of the wrong type."""


class ProgressSchemaMismatch(BackfillError):
    """The stored backfill_progress table does not have the columns this MV needs."""


class CorruptProgressRow(BackfillError):
    """A backfill_progress row cannot be decoded into a valid per-vnode progress."""


class InvalidProgressTransition(BackfillError):
    """A progress change the state machine forbids (moving back, moving after Completed)."""


class InconsistentSharedPosition(BackfillError):
    """no_shuffle vnodes of one run recovered with states that disagree."""


class InvalidMVDefinition(BackfillError):
    """The declarative MV definition is structurally wrong."""


class InvalidMVExpression(InvalidMVDefinition):
    """A filter or computed expression of the MV definition does not parse or does not work
    on the upstream's columns (the message names the expression and carries Spark's detail)."""


class MVNameClash(InvalidMVDefinition):
    """Two MV definitions of one catalog claim the same name (names are case-insensitive)."""


class MVLineageCycle(InvalidMVDefinition):
    """MVs read each other's outputs in a cycle, so none is a function of an upstream."""


class UnknownMV(BackfillError):
    """A job or a caller named an MV the catalog does not hold."""


class InvalidAggregate(InvalidMVDefinition):
    """An aggregate MV's group_by or aggregates cannot be kept exact: an unsupported or
    non-deterministic function, a type the aggregate cannot keep exact, a bad name."""


class AggregateModeUnsupported(InvalidAggregate):
    """An aggregate MV asked for a backfill mode its barrier does not run (arrangement,
    no_shuffle): aggregate MVs are built in snapshot mode (docs/AGGREGATES.md)."""


class AggregateOverflow(BackfillError):
    """An aggregate's value leaves its Spark result type (a sum beyond bigint or beyond the
    decimal's precision), where Spark's own GROUP BY would fail too."""


class AggregateStateMismatch(BackfillError):
    """Signed change rows retract what the aggregate state never held (a count below zero,
    an input row that is not there): the state is not the one these changes follow."""


class InvalidControl(BackfillError):
    """A bad runtime control: chunk size or rate limit."""


class InvalidVnode(BackfillError):
    """A vnode that is not a non-negative int, or not part of this run."""


class InvalidSnapshotChunk(BackfillError):
    """A snapshot read result that contradicts what was asked for (too many rows, ...)."""


class InvalidJoin(InvalidMVDefinition):
    """An MV's joins cannot be maintained as written: a join key that is not the dimension's
    declared key, an unknown column, a name clash, a kind other than inner / left
    (docs/JOINS.md)."""


class JoinMVNotServed(InvalidJoin):
    """An MV with joins reached a row MV's step, which would ignore the joins and write
    wrong rows: join MVs run through their own barrier (docs/JOINS.md)."""


class JoinModeUnsupported(InvalidJoin):
    """A join MV asked for a backfill mode its barrier does not run (arrangement,
    no_shuffle): join MVs are built in snapshot mode (docs/JOINS.md)."""


class DimensionKeyNotUnique(BackfillError):
    """A dimension holds two rows for one value of its declared key (a join would multiply
    the fact rows that reference it): the declared key is not the dimension's key."""


class JoinStateMismatch(BackfillError):
    """Signed changes retract a fact or dimension row the join state never held, or insert
    one it already holds: the state is not the one these changes follow."""


class JoinStateLayoutOutdated(JoinStateMismatch):
    """A join MV's state tables were made by an older layout (a facts table beside an index
    of fact keys), which this version does not read: reset the MV to rebuild them."""


# --- storage / Spark adapters, settings (resources/, storage/, upstream/, engine/)


class InvalidSettings(BackfillError, ValueError):
    """An environment variable read by resources/settings.py has a value it does not allow."""


class InvalidUpstreamSpec(BackfillError, ValueError):
    """An upstream table spec is malformed (unknown type, pk column missing, reserved name)."""


class NotAnUpstreamTable(BackfillError):
    """A table has no recorded primary key / vnode count (not created by create_upstream)."""


class TableNotFound(BackfillError):
    """No Delta table at the given URI."""


class UnsupportedTableFeature(BackfillError):
    """A Delta table uses a feature the parquet-file read path cannot honour (deletion vectors,
    column mapping)."""


class InvalidDmlBatch(BackfillError, ValueError):
    """A DML batch was rejected before anything was written."""


class NullPrimaryKey(InvalidDmlBatch):
    """A row or key of a DML batch has a null primary-key column."""


class DuplicatePrimaryKey(InvalidDmlBatch):
    """A key occurs twice in one batch, or an insert/pk-change target already exists."""


class MissingPrimaryKey(InvalidDmlBatch):
    """An update, delete or pk-change names a key that is not in the table."""


class UnknownColumn(InvalidDmlBatch):
    """A row of a DML batch has a column that is not in the table schema."""


class WrongColumnType(InvalidDmlBatch):
    """A value of a DML batch does not fit its column's type."""


class ChangeFeedDisabled(BackfillError):
    """The table's change data feed is off (for the requested versions)."""


class HistoryUnavailable(BackfillError):
    """The requested change-feed range cannot be read: vacuumed, log-truncated or out of range."""


class InvalidVersionRange(BackfillError, ValueError):
    """A version range whose start is after its end, or negative."""


class DimensionWithoutChangeFeed(InvalidJoin, ChangeFeedDisabled):
    """A joined dimension has no change data feed, so its changes could never reach the MV."""


# --- object storage (backfill_assets/storage/store/objects.py)


class UnsupportedStorage(BackfillError, ValueError):
    """A table URI whose scheme the storage layer cannot reach (only local paths and s3://)."""


class ConditionalWritesUnsupported(BackfillError):
    """The object store ignored a create-only (If-None-Match: *) write: commits are unsafe."""


class StoreUnavailable(BackfillError):
    """The object store did not answer while a commit was published, for longer than the
    commit waits (storage/store/create_put.py)."""

# ---- errors of the backfill step


class ConcurrentBackfillRun(BackfillError):
    """Another run wrote the same vnodes at the same time; this one wrote nothing more."""


class FollowerAlreadyRunning(BackfillError):
    """A follower run already follows some of these vnodes; two would only fence each other."""


class WarehouseNotWritable(BackfillError):
    """The warehouse folder cannot be written by this user."""


class UpstreamNotFound(BackfillError):
    """The MV's upstream table does not exist."""


class UpstreamSchemaChanged(BackfillError):
    """A column the backfill uses was dropped or changed type in the upstream."""


class UnsupportedColumnType(BackfillError):
    """An upstream column has a type the platform cannot carry."""


class VnodeCountChanged(BackfillError):
    """The MV's vnode count differs from the state already on disk."""


class NoShuffleLayoutMismatch(BackfillError):
    """no_shuffle mode on an upstream that is not arranged by the same vnodes."""


class RescaleRefused(BackfillError):
    """An in-progress no_shuffle backfill was asked to run over different vnode ranges."""


class BadPrimaryKeyInUpstream(BackfillError):
    """The upstream holds a null or duplicate primary key."""


class StorageMismatch(BackfillError):
    """What the store holds is not what the Delta log (or the writer) says it should hold:
    files an executor wrote that the driver cannot see, a read that returned a different row
    count than the log records, a log the storage layer cannot replay. Never committed over."""


class MVDefinitionChanged(BackfillError):
    """The MV definition differs from the one its state was built for (filter, computed
    columns, output columns, pk, mode or upstream): the MV is no longer f(upstream)."""


class MVResetRefused(BackfillError):
    """reset_mv_job was not confirmed with the MV's name, or cannot delete the MV's tables."""


class ResnapshotRefused(BackfillError):
    """resnapshot_job was asked for vnodes that are not finished or not the MV's."""


class UnknownVnodePartition(BackfillError, ValueError):
    """A run or launch names a vnode partition key the MV does not have (keys are zero-padded
    to the width of the MV's vnode count: `00`..`63` for 64 vnodes)."""
