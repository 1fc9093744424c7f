"""actors/loop_shared.py: one object per event loop and key, made once by episodes starting together, made
again when it is no longer alive, closed when its loop ends; another loop gets its own."""
from __future__ import annotations

import asyncio

from turnstream.actors.loop_shared import LoopShared


class Thing:
    def __init__(self):
        self.alive, self.closed = True, False

    async def close(self):
        self.closed = True


def test_one_object_per_loop_and_key_remade_when_dead_and_closed_with_its_loop():
    made: list[Thing] = []

    async def make():
        await asyncio.sleep(0.01)  # episodes starting together wait for the one being made
        made.append(Thing())
        return made[-1]

    shared = LoopShared("thing", alive=lambda t: t.alive, close=Thing.close)

    async def run():
        first = await asyncio.gather(*(shared.get(make) for _ in range(5)))
        assert len(made) == 1 and all(t is made[0] for t in first)
        assert await shared.get(make, key="other") is made[1]
        made[0].alive = False
        assert await shared.get(make) is made[2]
        assert shared.pop("other") is made[1] and shared.pop("other") is None
        assert not any(t.closed for t in made)
        return made[2]

    last = asyncio.run(run())
    assert all(t.closed for t in made)  # every one made, closed as its loop ended
    assert asyncio.run(shared.get(make)) is not last and len(made) == 4  # a new loop: a new object


def test_a_failed_make_leaves_nothing_behind():
    shared: LoopShared[Thing] = LoopShared("thing")
    calls = []

    async def make():
        calls.append(1)
        if len(calls) == 1:
            raise OSError("could not start")
        return Thing()

    async def run():
        try:
            await shared.get(make)
        except OSError:
            pass
        return await shared.get(make)

    assert isinstance(asyncio.run(run()), Thing) and len(calls) == 2
