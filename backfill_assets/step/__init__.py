"""The one step loop and what it runs: sources, chunk and bulk reads, the change side, checks
before a write, the barrier, continuous mode and the oracle."""
