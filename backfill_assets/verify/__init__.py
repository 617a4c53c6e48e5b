"""Verification: the independent oracle that recomputes the MV from the upstream and compares
it row for row (oracle.py), shared by verify_job, the matches_oracle check and the tests."""
