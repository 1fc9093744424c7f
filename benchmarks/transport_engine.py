"""Route (c) of `turnstream bench transport`: a process that owns vLLM's `AsyncLLM` and answers ZeroMQ requests.

    python -m benchmarks.transport_engine --bind tcp://127.0.0.1:PORT -- VLLM_SERVER_ARGS...

The engine is built exactly as vLLM's API server builds it (`build_async_engine_client` from the same command
line), so the engine core, its process and its statistics are the server's; only the front differs: a ROUTER
socket instead of HTTP, one msgpack map per request and per reply (the shapes below), every request answered
by its own task, so that many are in flight at once. A message it cannot read is answered with an error, when
its id can be read, and counted; the counts go to stderr when the process stops (SIGTERM).
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import msgpack

from turnstream.actors.inference.client import InferenceError, parse_version


class MalformedMessage(ValueError):
    """A frame that is not a request or a reply of this front; the message names what is wrong."""


def _unpack_map(frame: bytes) -> dict:
    try:
        body = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise MalformedMessage(f"not msgpack: {exc}") from None
    if not isinstance(body, dict):
        raise MalformedMessage(f"a msgpack map was expected, got {type(body).__name__}")
    return body


def _field(body: dict, name: str, kind: type | tuple[type, ...]) -> Any:
    if name not in body:
        raise MalformedMessage(f"missing field {name!r}")
    value = body[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise MalformedMessage(f"field {name!r} has the wrong type ({type(value).__name__})")
    return value


def _token_ids(body: dict, name: str, allow_empty: bool) -> list[int]:
    ids = _field(body, name, list)
    if not allow_empty and not ids:
        raise MalformedMessage(f"field {name!r} is empty")
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise MalformedMessage(f"field {name!r} must hold non-negative integer token ids")
    return ids


@dataclass(frozen=True)
class SamplingSpec:
    """The sampling parameters a request may set: vLLM `SamplingParams` fields, with an actor's meanings."""
    max_tokens: int
    temperature: float = 1.0
    logprobs: int = 0  # 0: the log-prob of the sampled token only
    seed: int | None = None
    top_p: float = 1.0
    top_k: int = 0
    allowed_token_ids: list[int] | None = None

    @classmethod
    def from_map(cls, body: Any) -> SamplingSpec:
        if not isinstance(body, dict):
            raise MalformedMessage("field 'sampling' must be a map")
        unknown = set(body) - set(cls.__dataclass_fields__)
        if unknown:
            raise MalformedMessage(f"unknown sampling parameters {sorted(unknown)}")
        max_tokens = _field(body, "max_tokens", int)
        if max_tokens < 1:
            raise MalformedMessage("sampling 'max_tokens' must be at least 1")
        kinds = {"temperature": (int, float), "logprobs": int, "seed": int, "top_p": (int, float), "top_k": int}
        values = {name: _field(body, name, kind) for name, kind in kinds.items() if body.get(name) is not None}
        if body.get("allowed_token_ids") is not None:
            values["allowed_token_ids"] = _token_ids(body, "allowed_token_ids", allow_empty=False)
        return cls(max_tokens=max_tokens, **values)

    def as_map(self) -> dict:
        """The parameters that differ from vLLM's defaults, and always max_tokens, temperature and logprobs."""
        out = asdict(self)
        for name, default in (("seed", None), ("top_p", 1.0), ("top_k", 0), ("allowed_token_ids", None)):
            if out[name] == default:
                del out[name]
        return out


@dataclass(frozen=True)
class SampleRequest:
    """One turn to sample: prompt token ids and sampling parameters. `id` is the client's, echoed in the reply."""
    id: int
    token_ids: list[int]
    sampling: SamplingSpec

    def encode(self) -> bytes:
        return msgpack.packb({"id": self.id, "token_ids": self.token_ids, "sampling": self.sampling.as_map()})

    @classmethod
    def decode(cls, frame: bytes) -> SampleRequest:
        body = _unpack_map(frame)
        return cls(_field(body, "id", int), _token_ids(body, "token_ids", allow_empty=False),
                   SamplingSpec.from_map(_field(body, "sampling", dict)))


@dataclass(frozen=True)
class VersionSpan:
    """Generated tokens [start, end) came from the weights vLLM labels `version` ("default": the loaded ones)."""
    version: str
    start: int
    end: int


@dataclass(frozen=True)
class SampleReply:
    """The sampled tokens, the log-prob of each, the weight version spans over them; or, on failure, `error`."""
    id: int
    token_ids: list[int]
    logprobs: list[float]
    versions: list[VersionSpan]
    finish_reason: str
    error: str = ""

    @classmethod
    def failure(cls, request_id: int, error: str) -> SampleReply:
        return cls(request_id, [], [], [], "error", error)

    def token_versions(self) -> list[int]:
        """Each token's policy version, as the actor reads vLLM's labels."""
        out = [0] * len(self.token_ids)
        for span in self.versions:
            out[span.start:span.end] = [parse_version(span.version)] * (span.end - span.start)
        return out

    def encode(self) -> bytes:
        body: dict = {"id": self.id, "token_ids": self.token_ids, "logprobs": self.logprobs,
                      "versions": [[s.version, s.start, s.end] for s in self.versions],
                      "finish_reason": self.finish_reason}
        if self.error:
            body["error"] = self.error
        return msgpack.packb(body)

    @classmethod
    def decode(cls, frame: bytes) -> SampleReply:
        body = _unpack_map(frame)
        request_id = _field(body, "id", int)
        if body.get("error"):
            return cls.failure(request_id, str(body["error"]))
        tokens = _token_ids(body, "token_ids", allow_empty=True)
        logprobs = _field(body, "logprobs", list)
        if len(logprobs) != len(tokens) or not all(isinstance(x, (int, float)) for x in logprobs):
            raise MalformedMessage("field 'logprobs' must hold one number per token")
        try:
            spans = [VersionSpan(str(v), int(a), int(b)) for v, a, b in _field(body, "versions", list)]
        except (TypeError, ValueError):
            raise MalformedMessage("field 'versions' must hold [version, start, end] spans") from None
        if sorted(i for s in spans for i in range(s.start, s.end)) != list(range(len(tokens))):
            raise MalformedMessage("field 'versions' must cover each token once")
        reply = cls(request_id, tokens, [float(x) for x in logprobs], spans, str(_field(body, "finish_reason", str)))
        try:
            reply.token_versions()
        except InferenceError as exc:
            raise MalformedMessage(f"a weight version label is not a policy version: {exc}") from None
        return reply


def reply_from_output(request_id: int, output: Any) -> SampleReply:
    """The reply for vLLM's final `CompletionOutput` of a request: its tokens, each one's log-prob as sampled, and
    the weight version spans vLLM stamped; a failure reply when the output lacks either."""
    tokens = [int(t) for t in output.token_ids]
    if output.logprobs is None or output.weight_versions is None:
        return SampleReply.failure(request_id, "the engine returned no log-probs or no weight versions")
    logprobs = []
    for position, token in enumerate(tokens):
        entry = output.logprobs[position].get(token) if output.logprobs[position] is not None else None
        if entry is None:
            return SampleReply.failure(request_id, f"no log-prob for sampled token {token} at {position}")
        logprobs.append(float(entry.logprob))
    spans = [VersionSpan(str(s.version), int(s.start), int(s.end)) for s in output.weight_versions]
    return SampleReply(request_id, tokens, logprobs, spans, str(output.finish_reason))


def readable_id(frame: bytes) -> int | None:
    """The id of a malformed request, when it has one, so that its client hears why it was refused."""
    try:
        request_id = _field(_unpack_map(frame), "id", int)
    except MalformedMessage:
        return None
    return request_id


@dataclass
class FrontCounters:
    answered: int = 0
    failed: int = 0  # requests the engine could not serve (answered with an error)
    malformed: int = 0  # frames that were not requests
    in_flight: set = field(default_factory=set)  # the answering tasks, held so that none is collected early


async def _answer(engine, sock, identity: bytes, request: SampleRequest, request_id: str,
                  counters: FrontCounters) -> None:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(**request.sampling.as_map(), output_kind=RequestOutputKind.FINAL_ONLY)
    try:
        final = None
        async for final in engine.generate({"prompt_token_ids": request.token_ids}, params, request_id):
            pass
        reply = reply_from_output(request.id, final.outputs[0])
    except Exception as exc:  # the engine refused this request (too long, ...): the client hears why
        reply = SampleReply.failure(request.id, f"{type(exc).__name__}: {exc}")
    counters.failed += bool(reply.error)
    counters.answered += not reply.error
    await sock.send_multipart([identity, reply.encode()])


async def _receive(engine, sock, counters: FrontCounters) -> None:
    serial = itertools.count()
    while True:
        identity, frame = await sock.recv_multipart()
        try:
            request = SampleRequest.decode(frame)
        except MalformedMessage as exc:
            counters.malformed += 1
            request_id = readable_id(frame)
            if request_id is not None:
                await sock.send_multipart([identity, SampleReply.failure(request_id, str(exc)).encode()])
            continue
        task = asyncio.create_task(_answer(engine, sock, identity, request, f"zmq-{next(serial)}", counters))
        counters.in_flight.add(task)
        task.add_done_callback(counters.in_flight.discard)


async def serve(vllm_args: argparse.Namespace, bind: str) -> FrontCounters:
    """Build the engine as vLLM's API server does, answer requests on `bind` until SIGTERM or SIGINT."""
    import zmq
    import zmq.asyncio
    from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client

    counters = FrontCounters()
    async with build_async_engine_client(vllm_args) as engine:
        context = zmq.asyncio.Context()
        sock = context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(bind)
        receiving = asyncio.create_task(_receive(engine, sock, counters))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, receiving.cancel)
        try:
            await receiving
        except asyncio.CancelledError:
            pass
        finally:
            sock.close()
            context.term()
    return counters


def main(argv: list[str]) -> int:
    import vllm.v1.utils as vllm_utils
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    own = argparse.ArgumentParser(prog="benchmarks.transport_engine")
    own.add_argument("--bind", required=True, help="ZeroMQ address of the ROUTER socket, e.g. tcp://127.0.0.1:5555")
    split = argv.index("--") if "--" in argv else len(argv)
    ours = own.parse_args(argv[:split])
    cli_env_setup()  # as vLLM's server entry point: how it starts its engine core process
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm server arguments"))
    vllm_args = parser.parse_args(argv[split + 1:])
    validate_parsed_serve_args(vllm_args)
    # the event loop vLLM's API server runs on, so that the front differs from route (a) by its transport only;
    # uvloop as vLLM imports it, since it comes with vLLM and not as a dependency of this checkout
    counters = vllm_utils.uvloop.run(serve(vllm_args, ours.bind))
    print(f"engine front: answered {counters.answered}, failed {counters.failed}, malformed {counters.malformed}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
