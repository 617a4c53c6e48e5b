"""One module per backfill mode."""
