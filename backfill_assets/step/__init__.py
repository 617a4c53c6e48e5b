"""The one step loop and its parts: one barrier's step for a set of vnodes (recover, replicate,
forward, read the snapshot chunk, commit), the snapshot sources, chunk and bulk reads, the
change side, the checks before a write, and the modes (step/modes/). What runs steps (a
barrier under a rate limit, by cost, a re-snapshot, the follower) is one layer up, in
barrier/."""
