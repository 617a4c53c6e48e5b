"""What runs the steps of a barrier: the controls in force and the path a barrier takes
(runner.py), the rate limit kept over time (pacing.py: the one place it lives), the choice
between applying a barrier's changes and re-reading its finished vnodes (by_cost.py),
re-snapshot on demand (resnapshot.py) and continuous mode (follower.py). The step itself is
in step/, one layer down."""
