"""What a join barrier reads of its facts table, and what it need not read.

Why the change feed stands in for the facts table: a changed fact's row at the barrier's start
is its netted pre-image (the -1 row `sources.signed_changes` gives, the row before the range),
which is exactly what the facts table holds for that pk at the progress's pair. Reading the
facts table for 20,000 changed pks spread over every vnode is a read of the whole table;
taking their rows from the change feed leaves only the facts a dimension change reaches (pks
the index lists under a changed key) to be read. A pk inserted in the range has no pre-image
and is not held.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.arrow.aggregate_state import SIGN
from backfill_assets.join.store import FACTS, JoinStore
from backfill_assets.storage import TableVersion


def fact_rows(store: JoinStore, snap: TableVersion, fact_changes: pa.Table,
              reached: pa.Table) -> pa.Table:
    """The facts table's rows of the ``reached`` pks at ``snap`` (the barrier's start): the
    changed pks' from their pre-images, the others read by key."""
    jt = store.jt
    pk, schema = list(jt.plan.pk), jt.fact_schema
    before = fact_changes.filter(pc.equal(fact_changes.column(SIGN), -1))
    before = jt.with_vnode(before.select(schema.names[:-1]), pk).cast(schema)
    changed = fact_changes.select(pk).cast(pa.schema([schema.field(k) for k in pk]))
    others = reached.join(changed, keys=pk, join_type="left anti", use_threads=False)
    return pa.concat_tables([before, store.read(snap, FACTS, others)])
