"""Token-in/token-out requests to vLLM's /inference/v1/generate and strict parsing of the reply.

The fleet of servers (balancing, health, retries) is `actors.inference.fleet.InferenceFleet`.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

INITIAL_VERSION_LABEL = "default"  # what vLLM calls the weights it loaded at start; our version 0


class InferenceError(RuntimeError):
    pass


class ServerFailure(InferenceError):
    """The server failed (down, 5xx, timeout, garbage); the same request may succeed on another one."""


class StaleConnection(ServerFailure):
    """A pooled keep-alive connection the server had already closed: retry the same server once."""


class RequestTimedOut(ServerFailure):
    """No reply within the time the request had left: its deadline, not evidence against the server."""


@dataclass
class Generation:
    tokens: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    # the truncation the tokens were sampled under (top_p 1 and top_k 0: none), which the learner applies too
    top_p: float = 1.0
    top_k: int = 0
    seed: int = -1  # vLLM's sampling seed of the request, with which it samples the same tokens again; -1: none


def parse_version(label: str) -> int:
    if label == INITIAL_VERSION_LABEL:
        return 0
    try:
        return int(label)
    except ValueError:
        raise InferenceError(f"weight version {label!r} is not an integer policy version") from None


def parse_generation(body: dict) -> Generation:
    try:
        choice = body["choices"][0]
        tokens = [int(t) for t in choice["token_ids"]]
        logprobs = [float(e["logprob"]) for e in choice["logprobs"]["content"]]
        versions = [0] * len(tokens)
        for span in choice["weight_versions"]:
            v = parse_version(str(span["version"]))
            for i in range(int(span["start"]), int(span["end"])):
                versions[i] = v
        covered = sum(int(s["end"]) - int(s["start"]) for s in choice["weight_versions"])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise InferenceError(f"malformed generate response: {exc!r}") from None
    if len(logprobs) != len(tokens) or covered != len(tokens):
        raise InferenceError("generate response: tokens, logprobs and version spans disagree in length")
    return Generation(tokens, logprobs, versions, str(choice.get("finish_reason")))


async def post_generate(session: aiohttp.ClientSession, url: str, token_ids: list[int], *, max_tokens: int,
                        temperature: float, allowed_token_ids: list[int] | None = None,
                        cache_salt: str | None = None, extra_params: dict | None = None,
                        model: str | None = None, top_p: float = 1.0, top_k: int = 0, seed: int = -1,
                        timeout_s: float | None = None) -> Generation:
    """One token-in/token-out request to one server, given up after `timeout_s` (None: the session's limit).
    ServerFailure: try again, there or on another server; InferenceError: don't. `model`: a LoRA adapter the
    server serves (learner.lora), else the base model; `top_p` < 1, `top_k` > 0: vLLM truncates the distribution
    it samples from, and its log-probs are those of the truncated one; `seed` >= 0: the request's own random
    stream (-1: the server's shared one)."""
    params: dict = {**(extra_params or {}), "max_tokens": max_tokens, "temperature": temperature, "logprobs": 0}
    if seed >= 0:
        params["seed"] = seed
    if allowed_token_ids:
        params["allowed_token_ids"] = allowed_token_ids
    if top_p < 1:
        params["top_p"] = top_p
    if top_k > 0:
        params["top_k"] = top_k
    body: dict = {"token_ids": token_ids, "sampling_params": params}
    if cache_salt:
        body["cache_salt"] = cache_salt
    if model:
        body["model"] = model
    endpoint = url + "/inference/v1/generate"
    limit = {} if timeout_s is None else {"timeout": aiohttp.ClientTimeout(total=timeout_s)}
    try:
        async with session.post(endpoint, json=body, **limit) as resp:
            if resp.status == 404 and model:
                # the server does not hold the adapter (yet): it started or restarted after the learner's last
                # push, whose re-sync loads it; another server may have it
                raise ServerFailure(f"{endpoint}: HTTP 404 for adapter {model!r}: {(await resp.text())[:200]}")
            if 400 <= resp.status < 500:  # our request is wrong (e.g. too long): another server will agree
                raise InferenceError(f"{endpoint}: HTTP {resp.status}: {(await resp.text())[:200]}")
            if resp.status != 200:
                raise ServerFailure(f"{endpoint}: HTTP {resp.status}: {(await resp.text())[:200]}")
            payload = await resp.json()
    except aiohttp.ServerDisconnectedError as exc:
        raise StaleConnection(f"{endpoint}: {_described(exc)}") from None
    except asyncio.TimeoutError:
        raise RequestTimedOut(f"{endpoint}: no reply in the time the request had left") from None
    except (aiohttp.ClientError, ValueError) as exc:
        raise ServerFailure(f"{endpoint}: {_described(exc)}") from None
    try:
        gen = parse_generation(payload)
    except InferenceError as exc:
        raise ServerFailure(str(exc)) from None  # a server answering garbage is treated as failing
    gen.top_p, gen.top_k, gen.seed = top_p, top_k, seed
    return gen


def _described(exc: Exception) -> str:
    """The error's kind and message, which names the cause (refused, no route to host, reset) in words."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
