"""The Dagster wiring: assets, checks, sensors, partitions, metadata, run liveness and the run
launcher. Wiring only: the work is in the layers below."""
