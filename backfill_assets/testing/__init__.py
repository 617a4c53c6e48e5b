"""Hooks that exist only for the tests: the kill hook (kill_hook.py) that the crash tests set
through BACKFILL_TEST_KILL_AT; production wires it as a no-op."""
