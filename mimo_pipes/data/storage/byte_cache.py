"""A thread-safe least-recently-used cache of values whose sizes are known, bounded in total bytes."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class ByteBoundedCache(Generic[V]):
    """Keeps the most recently used values while their sizes add up to at most ``limit`` bytes; the newest value
    is kept even when it alone is larger (it is being read). ``loads`` counts the values built."""

    def __init__(self, limit: int, size_of: Callable[[V], int]) -> None:
        self.limit = limit
        self.size_of = size_of
        self.loads = 0
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        self._building: dict[Hashable, threading.Lock] = {}

    @property
    def held_bytes(self) -> int:
        return self._held

    def __contains__(self, key: Hashable) -> bool:
        """Whether ``key``'s value is held or being built."""
        with self._lock:
            return key in self._items or key in self._building

    def get(self, key: Hashable, build: Callable[[], V]) -> V:
        """The value of ``key``, built once with ``build()`` when it is not held (other threads asking for the
        same key meanwhile wait for that build rather than repeat the request)."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key][0]
            gate = self._building.setdefault(key, threading.Lock())
        with gate:
            with self._lock:
                if key in self._items:
                    self._items.move_to_end(key)
                    return self._items[key][0]
            try:
                value = build()
            except BaseException:
                with self._lock:
                    self._building.pop(key, None)
                raise
            with self._lock:
                self.loads += 1
                self._building.pop(key, None)
                self._put(key, value)
            return value

    def _put(self, key: Hashable, value: V) -> None:
        size = self.size_of(value)
        self._items[key] = (value, size)
        self._held += size
        while self._held > self.limit and len(self._items) > 1:
            _, (_, dropped) = self._items.popitem(last=False)
            self._held -= dropped
