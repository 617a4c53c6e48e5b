"""Spark adapters: the vnode column, netting change rows and projecting rows through the MV
definition in Spark."""
