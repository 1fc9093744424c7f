"""The task source's position (actors/tasks/position.py): what is saved, and where a restarted actor goes on."""
from __future__ import annotations

import asyncio
import json
import logging

from turnstream.actors.tasks.orders import SequentialOrder
from turnstream.actors.tasks.position import keep_saving, position_path, restore_position, save_position
from turnstream.actors.tasks.source import TaskSource


def source(group_size: int = 1, **kw) -> TaskSource:
    return TaskSource(SequentialOrder(10, run_seed=3, **kw), group_size)


def test_a_sequential_order_set_to_n_draws_goes_on_with_draw_n():
    first = source()
    whole = [first.next() for _ in range(25)]
    later = source()
    later.resume(13)
    assert [later.next() for _ in range(12)] == whole[13:]
    sharded = [TaskSource(SequentialOrder(10, run_seed=3, shard=1, num_shards=3)) for _ in range(2)]
    first = [sharded[0].next() for _ in range(8)]
    sharded[1].resume(5)
    assert [sharded[1].next() for _ in range(3)] == first[5:]


def test_the_resume_point_is_the_first_draw_not_played_in_full():
    s = source(group_size=2)
    handed = [s.next() for _ in range(5)]  # draws 0, 0, 1, 1, 2 (draw 2 has one member still to hand out)
    assert [a.draw for a in handed] == [0, 0, 1, 1, 2]
    for a in (handed[2], handed[3], handed[0]):  # draw 1 finished, draw 0 half
        s.played(a, ["k"])
    assert s.resume_point() == 0
    s.played(handed[1], ["k"])
    assert s.resume_point() == 2  # draw 2: played in part, one member never handed out
    s.played(handed[4], ["k"])
    assert s.resume_point() == 2
    s.played(s.next(), ["k"])
    assert s.resume_point() == 3


def test_an_order_that_ran_out_resumes_as_ran_out(tmp_path):
    s = source(epochs=1)
    for a in iter(s.next, None):
        s.played(a, ["k"])
    path = position_path(tmp_path, 0)
    assert save_position(path, s) == 10
    again = source(epochs=1)
    assert restore_position(path, again) == 10 and again.next() is None  # the epoch is not drawn again


def test_a_saved_position_restores_and_one_of_another_run_is_refused(tmp_path, caplog):
    path = position_path(tmp_path, 2)
    s = source()
    for _ in range(4):
        s.played(s.next(), ["k"])
    save_position(path, s)
    assert json.loads(path.read_text())["draws"] == 4
    again = source()
    assert restore_position(path, again) == 4 and again.next().draw == 4
    with caplog.at_level(logging.WARNING):
        assert restore_position(path, TaskSource(SequentialOrder(10, run_seed=4))) is None  # another seed
        assert restore_position(path, source(group_size=2)) is None
        path.write_text("{not json")
        assert restore_position(path, source()) is None
    assert caplog.text.count("starting from the first draw") == 3
    assert restore_position(tmp_path / "none.json", source()) is None  # a first start: nothing saved, no warning


async def test_the_position_is_saved_while_it_moves(tmp_path):
    path, s = tmp_path / "p.json", source()
    saver = asyncio.create_task(keep_saving(path, s, interval_s=0.01))
    try:
        s.played(s.next(), ["k"])
        for _ in range(100):
            await asyncio.sleep(0.01)
            if path.exists() and json.loads(path.read_text())["draws"] == 1:
                break
        assert json.loads(path.read_text())["draws"] == 1
    finally:
        saver.cancel()
