"""Reading any upstream (its layout and keys from its log) and, in ``writer``, the platform's
own upstream table: spec, value checks, DML and the load generator (not on the runtime path)."""
