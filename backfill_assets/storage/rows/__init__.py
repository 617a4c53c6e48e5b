"""Rows in and out of Delta versions: a version into Spark, rows into data files, commits, the
change feed of a version range, the arrangement replica and key lookups."""
