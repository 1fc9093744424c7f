"""AckGroup: delayed acks grouped per actor (buffer/acks.py)."""
from __future__ import annotations

from turnstream.buffer.acks import ACK_AFTER_CHUNKS, AckGroup
from turnstream.protocol.codec import decode
from turnstream.protocol.messages import AckBatch


def test_an_empty_group_has_nothing_to_wait_for_and_nothing_due():
    group = AckGroup(delay_s=60.0)
    group.add(b"a", [])
    assert group.wait_s() is None and not group.due() and group.take_replies() == []


def test_acks_wait_for_the_delay_unless_the_group_is_full():
    group = AckGroup(delay_s=60.0)
    group.add(b"a", [(0, "ok", "")])
    assert 0 < group.wait_s() <= 60.0 and not group.due()
    group.add(b"a", [(seq, "ok", "") for seq in range(1, ACK_AFTER_CHUNKS)])
    assert group.due()


def test_no_delay_makes_every_ack_due_at_once():
    group = AckGroup(delay_s=0.0)
    group.add(b"a", [(0, "ok", "")])
    assert group.due()


def test_one_message_per_actor_in_order_then_empty():
    group = AckGroup(delay_s=0.0)
    group.add(b"a", [(0, "ok", "")])
    group.add(b"b", [(7, "rejected", "bad_logprob")])
    group.add(b"a", [(1, "duplicate", ""), (2, "rejected", "empty_prompt")])
    replies = {r[0]: decode(r[1:]) for r in group.take_replies()}
    b = replies[b"b"]
    assert b.seq.tolist() == [7] and b.status.tolist() == [2] and b.reasons == ["bad_logprob"]
    a = replies[b"a"]
    assert isinstance(a, AckBatch) and a.seq.tolist() == [0, 1, 2]
    assert [AckBatch.STATUSES[code] for code in a.status.tolist()] == ["ok", "duplicate", "rejected"]
    assert a.reasons == ["empty_prompt"]
    assert group.wait_s() is None and group.take_replies() == []
