"""Token-in/token-out client for vLLM's /inference/v1/generate, over one shared aiohttp session."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import aiohttp

INITIAL_VERSION_LABEL = "default"  # what vLLM calls the weights it loaded at start; our version 0


class InferenceError(RuntimeError):
    pass


@dataclass
class Generation:
    tokens: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str


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


class VllmClient:
    """Round-robin over servers (the fleet with health checks and balancing is a later step)."""

    def __init__(self, urls: list[str], timeout_s: float = 60.0):
        if not urls:
            raise ValueError("no vLLM server URLs")
        self.urls = urls
        self._next = itertools.cycle(range(len(urls)))
        self._session: aiohttp.ClientSession | None = None
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def __aenter__(self) -> "VllmClient":
        self._session = aiohttp.ClientSession(timeout=self.timeout,
                                              connector=aiohttp.TCPConnector(limit=0))
        return self

    async def __aexit__(self, *exc) -> None:
        if self._session is not None:
            await self._session.close()

    async def generate(self, token_ids: list[int], *, max_tokens: int, temperature: float,
                       allowed_token_ids: list[int] | None = None, cache_salt: str | None = None) -> Generation:
        assert self._session is not None, "use `async with VllmClient(...)`"
        params: dict = {"max_tokens": max_tokens, "temperature": temperature, "logprobs": 0}
        if allowed_token_ids:
            params["allowed_token_ids"] = allowed_token_ids
        body: dict = {"token_ids": token_ids, "sampling_params": params}
        if cache_salt:
            body["cache_salt"] = cache_salt
        url = self.urls[next(self._next)] + "/inference/v1/generate"
        try:
            async with self._session.post(url, json=body) as resp:
                if resp.status != 200:
                    raise InferenceError(f"{url}: HTTP {resp.status}: {(await resp.text())[:200]}")
                return parse_generation(await resp.json())
        except aiohttp.ClientError as exc:
            raise InferenceError(f"{url}: {exc!r}") from None
