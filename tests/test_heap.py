"""A process's second step freezes the heap (once), or its first step as it ends when it ran
long: later full collections scan only what was made since. A process that runs one short
step never pays for the collection."""

from __future__ import annotations

import gc

import pytest

from backfill_assets.step import heap


@pytest.fixture
def fresh_process(monkeypatch):
    """The heap module as in a process that has run no step, nothing frozen."""
    monkeypatch.setattr(heap, "_steps_started", 0)
    monkeypatch.setattr(heap, "_settled", False)
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_the_second_step_freezes_the_heap_once(fresh_process):
    heap.step_starting()
    assert gc.get_freeze_count() == 0  # a one-step process pays nothing
    heap.step_starting()
    frozen = gc.get_freeze_count()
    assert frozen > 1000  # the modules, classes and caches alive now
    kept = [[] for _ in range(20_000)]  # alive at the third step: a second freeze takes them
    heap.step_starting()
    # only once (other threads may free frozen objects meanwhile: the count can only fall)
    assert gc.get_freeze_count() < frozen + 10_000
    del kept
    garbage = [[]]
    garbage[0].append(garbage)  # a cycle made after the freeze is still collected
    del garbage
    assert gc.collect() >= 1


def test_a_long_first_step_freezes_the_heap_as_it_ends(fresh_process):
    heap.step_starting()
    heap.step_ended(heap.LONG_STEP_SECONDS / 10)
    assert gc.get_freeze_count() == 0  # a short first step: nothing yet
    heap.step_ended(heap.LONG_STEP_SECONDS)
    frozen = gc.get_freeze_count()
    assert frozen > 1000
    kept = [[] for _ in range(20_000)]
    heap.step_starting()  # the second step does not settle again
    assert gc.get_freeze_count() < frozen + 10_000
    del kept
