"""Time ``next()`` on a DataLoader's iterators as phase ``data``, without touching the loop that iterates it.

The problem: ``training.watch``, the Transformers callback and zero-code activation time loops they
do not own, so they cannot wrap the loop's ``for batch in loader`` as ``run.data(loader)`` does. Here
:class:`LoaderTimer` swaps the loader instance's class for a subclass whose ``__iter__`` returns a
:class:`TimedIterator` (the class comes back on ``undo()``), and :class:`TimedIterator` closes the phases
still open, times ``next()`` as ``data`` and reports each batch. ``training.hooks`` re-exports both
(docs/training.md, "Writing an integration").
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from . import context as _context
from .run import Phase


class TimedIterator:
    """An iterator over a loader's iterator whose ``next()`` is ``phase`` (``data``): every phase still open is
    closed first (a training forward's ``compute`` ends when the next batch is fetched); ``on_batch(batch)`` runs
    after each batch; other attributes pass through to the iterator. Shared with zero-code activation (auto.py).
    """

    __slots__ = ("_close", "_it", "_on_batch", "_phase")

    def __init__(self, it: Iterator[Any], phase: Phase, on_batch: Callable[[Any], None]) -> None:
        self._it, self._phase, self._on_batch, self._close = it, phase, on_batch, phase.run.close_phases

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self) -> Any:
        self._close()
        with self._phase:
            item = next(self._it)
        self._on_batch(item)
        return item

    def __len__(self) -> int:
        return len(self._it)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)


@functools.cache
def _timed_class(cls: type) -> type:
    """A subclass of loader class ``cls`` whose ``__iter__`` returns a timed iterator (one per class)."""
    def __iter__(self: Any) -> Iterator[Any]:
        hooks = self.__dict__["_gpu_exporter_data"]
        return TimedIterator(cls.__iter__(self), *hooks)  # type: ignore[attr-defined]

    return type(cls.__name__, (cls,), {"__iter__": __iter__, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__})


class LoaderTimer:
    """Time ``next()`` on every iterator of ``loader`` as ``phase``; ``undo()`` restores the loader.

    ``on_batch(batch)`` runs after each fetched batch (counting samples). An accelerate
    ``DataLoaderShard`` (which hides its class) is timed through its ``base_dataloader``.
    """

    def __init__(self, loader: Any, phase: Phase, on_batch: Callable[[Any], None]) -> None:
        target = getattr(loader, "base_dataloader", None)
        if target is None:  # not `or`: truth-testing a DataLoader asks its len(), which an iterable one lacks
            target = loader
        if not hasattr(type(target), "__iter__"):
            raise TypeError(f"training.watch: loader must be iterable (a DataLoader), not {type(target).__name__}")
        if "_gpu_exporter_data" in vars(target):
            raise ValueError("training.watch: this loader is already watched")
        self._target = target
        self._cls: type = type(target)
        _context.note_loader(phase.run, target)  # num_workers, pin_memory, ... for concrete remedies
        object.__setattr__(target, "_gpu_exporter_data", (phase, on_batch))
        object.__setattr__(target, "__class__", _timed_class(self._cls))  # type: ignore[arg-type]  # a class hashes

    def undo(self) -> None:
        target = self._target
        if type(target) is _timed_class(self._cls):
            object.__setattr__(target, "__class__", self._cls)
        vars(target).pop("_gpu_exporter_data", None)
