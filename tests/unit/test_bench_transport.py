"""bench transport's pure parts: the ZeroMQ/msgpack messages of the engine front (route c), the reply built from
vLLM's output, the demo's prompts, and the statistics (the median of windows, the ratio to today's route)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

import msgpack
import pytest

from benchmarks.transport import Route, demo_turns, measure, summarise, window_rates
from benchmarks.transport_engine import (MalformedMessage, SampleReply, SampleRequest, SamplingSpec, VersionSpan,
                                         reply_from_output)


def test_a_request_survives_the_wire():
    request = SampleRequest(7, [5, 6, 7], SamplingSpec(max_tokens=1, temperature=1.0, logprobs=0))
    assert SampleRequest.decode(request.encode()) == request
    # msgpack map with the field names a client in another language would write
    assert msgpack.unpackb(request.encode()) == {
        "id": 7, "token_ids": [5, 6, 7], "sampling": {"max_tokens": 1, "temperature": 1.0, "logprobs": 0}}


@pytest.mark.parametrize("frame, names", [
    (b"\xc1", "msgpack"),
    (msgpack.packb([1, 2]), "map"),
    (msgpack.packb({"token_ids": [1], "sampling": {"max_tokens": 1}}), "id"),
    (msgpack.packb({"id": 1, "token_ids": [], "sampling": {"max_tokens": 1}}), "token_ids"),
    (msgpack.packb({"id": 1, "token_ids": [1, -2], "sampling": {"max_tokens": 1}}), "token_ids"),
    (msgpack.packb({"id": 1, "token_ids": ["a"], "sampling": {"max_tokens": 1}}), "token_ids"),
    (msgpack.packb({"id": 1, "token_ids": [1], "sampling": {"max_tokens": 0}}), "max_tokens"),
    (msgpack.packb({"id": 1, "token_ids": [1], "sampling": {"max_tokens": 1, "beam": 4}}), "beam"),
    (msgpack.packb({"id": 1, "token_ids": [1], "sampling": {"max_tokens": 1, "temperature": "hot"}}),
     "temperature"),
])
def test_a_malformed_request_is_refused_with_what_is_wrong(frame, names):
    with pytest.raises(MalformedMessage, match=names):
        SampleRequest.decode(frame)


def test_a_reply_survives_the_wire_and_gives_each_token_its_version():
    reply = SampleReply(7, [11, 12, 13], [-0.5, -1.25, -2.0],
                        [VersionSpan("default", 0, 1), VersionSpan("3", 1, 3)], "length")
    assert SampleReply.decode(reply.encode()) == reply
    assert reply.token_versions() == [0, 3, 3]
    failed = SampleReply.failure(7, "prompt too long")
    assert SampleReply.decode(failed.encode()) == failed and failed.error == "prompt too long"


@pytest.mark.parametrize("body, names", [
    ({"id": 1, "token_ids": [1, 2], "logprobs": [-1.0], "versions": [["0", 0, 2]], "finish_reason": "length"},
     "logprobs"),
    ({"id": 1, "token_ids": [1, 2], "logprobs": [-1.0, -1.0], "versions": [["0", 0, 1]], "finish_reason": "length"},
     "versions"),
    ({"id": 1, "token_ids": [1], "logprobs": [-1.0], "versions": [["x", 0, 1]], "finish_reason": "length"},
     "version"),
])
def test_a_reply_whose_parts_disagree_is_refused(body, names):
    with pytest.raises(MalformedMessage, match=names):
        SampleReply.decode(msgpack.packb(body))


@dataclass
class Logprob:  # the fields of vLLM's Logprob that a reply reads
    logprob: float


@dataclass
class Span:  # vLLM's WeightVersionSpan
    version: str
    start: int
    end: int


@dataclass
class Output:  # the fields of vLLM's CompletionOutput that a reply reads
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    weight_versions: list[Span] | None
    finish_reason: str | None


def test_the_reply_of_an_engine_output_holds_the_sampled_tokens_log_probs_and_versions():
    out = Output([9, 4], [{9: Logprob(-0.25), 1: Logprob(-3.0)}, {4: Logprob(-0.75)}],
                 [Span("2", 0, 1), Span("3", 1, 2)], "length")
    assert reply_from_output(5, out) == SampleReply(5, [9, 4], [-0.25, -0.75],
                                                    [VersionSpan("2", 0, 1), VersionSpan("3", 1, 2)], "length")


def test_an_engine_output_without_log_probs_or_versions_is_a_failure_reply():
    assert reply_from_output(5, Output([9], None, [Span("2", 0, 1)], "length")).error
    assert reply_from_output(5, Output([9], [{1: Logprob(-1.0)}], [Span("2", 0, 1)], "length")).error
    assert reply_from_output(5, Output([9], [{9: Logprob(-1.0)}], None, "length")).error


class Chat:
    """ChatTokens' shape: a first turn's tokens, a later turn's delta after the reply, a text's tokens."""

    def first_turn(self, observation: str) -> list[int]:
        return [100, len(observation)]

    def next_turn(self, observation: str, last_generated: list[int]) -> list[int]:
        return [200, *last_generated]

    def encode(self, text: str) -> list[int]:
        return [ord(text)]


def test_the_demo_s_turns_are_every_context_of_every_sign_sequence():
    turns = asyncio.run(demo_turns(Chat(), [2, 3]))
    assert len(turns) == 2 * 2 ** 2 + 3 * 2 ** 3  # k turns for each of the 2^k sequences of each length k
    first = turns[:2]  # the sequence LL: its first turn, then that context, the reply L and the next turn
    assert first == [[100, 17], [100, 17, ord("L"), 200, ord("L")]]
    assert all(turn[0] == 100 for turn in turns)


def test_window_rates_are_the_turns_of_each_window_over_its_length():
    assert window_rates([(0.0, 0), (2.0, 100), (4.0, 300), (5.0, 310)]) == [50.0, 100.0, 10.0]


def test_the_summary_gives_each_route_its_median_and_its_ratio_to_today_s_route():
    out = summarise({"http": [100.0, 120.0, 90.0], "engine_zmq": [250.0, 300.0, 200.0, 1000.0]}, baseline="http")
    assert out["turns_per_s"] == {"http": 100.0, "engine_zmq": 275.0}
    assert out["ratio_to_http"] == {"http": 1.0, "engine_zmq": 2.75}


def test_without_today_s_route_there_is_no_ratio():
    out = summarise({"engine_zmq": [250.0]}, baseline="http")
    assert out["turns_per_s"] == {"engine_zmq": 250.0} and out["ratio_to_http"] == {"engine_zmq": None}


class Sleepy(Route):
    """A route whose every call takes a few milliseconds and answers its turns; it counts what it answered."""

    def __init__(self, prompts_per_call: int):
        super().__init__("nowhere")
        self.prompts_per_call = prompts_per_call
        self.answered = 0
        self.in_flight = self.most_in_flight = 0
        self.prompts_seen: set[tuple[int, ...]] = set()
        self.refuse = False

    async def call(self, prompts):
        if self.refuse:
            self.errors += 1
            await asyncio.sleep(0.001)
            return 0
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.prompts_seen.update(tuple(p) for p in prompts)
        await asyncio.sleep(0.005)
        self.in_flight -= 1
        self.answered += len(prompts)
        return len(prompts)


@pytest.mark.parametrize("prompts_per_call", [1, 4])
def test_measure_counts_every_turn_answered_while_the_windows_run(prompts_per_call):
    route = Sleepy(prompts_per_call)
    turns = [[i] for i in range(40)]
    marks = asyncio.run(measure(route, turns, concurrency=16, warmup=0.0, window=0.1, rounds=2))
    assert len(marks) == 3 and marks[0][1] >= 1  # the warm-up starts at the first answer
    # what the marks counted is what the route answered, less the calls that ended after the last mark
    assert route.answered - 16 <= marks[-1][1] <= route.answered
    assert route.most_in_flight == 16 // prompts_per_call  # the turns in flight are the concurrency's
    assert len(route.prompts_seen) == len(turns)  # the in-flight calls go through every prompt


def test_measure_gives_up_when_no_turn_is_ever_answered(monkeypatch):
    from benchmarks import transport

    monkeypatch.setattr(transport, "FIRST_ANSWER_TIMEOUT_S", 0.2)
    route = Sleepy(1)
    route.refuse = True
    with pytest.raises(RuntimeError, match="no turn answered"):
        asyncio.run(measure(route, [[1]], concurrency=2, warmup=0.0, window=0.1, rounds=1))
    assert route.errors > 0
