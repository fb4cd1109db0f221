"""What an event loop's tasks ask for in one pass of the loop, handled together.

A training level's replies arrive within milliseconds of each other, and one transaction, query or round trip for all
of them costs a fraction of one each: storage.group_commit's writes and cache lookups and core.grpo.rollouts' scores
are asked for here, each kind in its own `Queues`."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Hashable
from typing import Any

Batch = list[tuple[Any, asyncio.Future]]
Queues = weakref.WeakKeyDictionary  # loop -> {group: Batch}, so a finished loop's batches go with it


def queues() -> Queues:
    """The waiting batches of one kind of ask, per event loop."""
    return weakref.WeakKeyDictionary()


async def asked_together(waiting: Queues, group: Hashable, item: Any, handle: Callable[[Any, Batch], None]) -> Any:
    """The result `handle` settles for `item`. At the loop's next pass `handle(group, batch)` runs once with every
    (item, future) asked under `group` meanwhile, and must settle each future (`settle`)."""
    loop = asyncio.get_running_loop()
    pending = waiting.setdefault(loop, {})
    batch = pending.get(group)
    if batch is None:
        batch = pending[group] = []
        loop.call_soon(lambda: handle(group, pending.pop(group)))
    future = loop.create_future()
    batch.append((item, future))
    return await future


def settle(future: asyncio.Future, *, result: Any = None, error: BaseException | None = None) -> None:
    """Give an asker its result or error; one whose task was cancelled meanwhile is left alone (the work asked for was
    done all the same, and nobody reads it)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
