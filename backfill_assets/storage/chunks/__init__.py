"""Chunk reads: where the rows after a position are (seeks by file bounds, cuts shared by a
run's vnodes, the read window) and the tasks that read them."""
