"""Files read by a few threads, handed back in their order: the readers go on while the caller
works on what they read (parquet reads and Arrow kernels release the GIL), and a caller that
stops early leaves the rest unread."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor


def in_order(pool: ThreadPoolExecutor, fn: Callable, items: Iterable, ahead_n: int
              ) -> Iterator[tuple[object, object]]:
    """``(item, fn(item))`` in order, at most ``ahead_n`` computed ahead (the readers go on
    while the caller folds): a caller that stops early leaves the rest unread (those not
    started are cancelled)."""
    ahead: deque[tuple[object, Future]] = deque()
    rest = iter(items)
    try:
        while True:
            while len(ahead) < ahead_n:
                item = next(rest, _END)
                if item is _END:
                    break
                ahead.append((item, pool.submit(fn, item)))
            if not ahead:
                return
            item, future = ahead.popleft()
            yield item, future.result()
    finally:
        for _, future in ahead:
            future.cancel()


_END = object()
