"""An in-process stand-in for a vLLM server's generate, health and weight routes (aiohttp)."""
from __future__ import annotations

import asyncio

from aiohttp import web

from turnstream.launch.processes import free_port


class FakeVllm:
    def __init__(self, name: str = "s", version: str = "default"):
        self.name, self.version = name, version
        self.world = 1  # workers in this server (TP x PP x DP)
        self.fail_status = 0  # answer generate with this status when set
        self.garbage = False
        self.prompt_logprob = -1.0  # what it scores every prompt token with where asked (prompt_logprobs)
        self.adapters: set[str] = set()  # LoRA adapters it serves; a request for another one is a 404, as vLLM's
        self.models: list[str | None] = []  # the `model` of each generate request
        self.sampling_params: list[dict] = []  # the `sampling_params` of each generate request
        self.lora_loading = True  # serves /v1/load_lora_adapter (vLLM: with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1)
        self.drop_connections = 0  # close this many generate connections without answering
        self.gate: asyncio.Event | None = None  # when set, generate waits for it
        self.in_flight = 0
        self.served = 0
        self.calls: list[tuple[str, object]] = []  # (path, body) of control calls, in order
        self.control_delay_s = 0.0
        self.fail_control: set[str] = set()
        self.hooks: dict = {}  # control route name -> async callable(body), awaited before answering
        self.log: list | None = None  # a list shared by several fakes: (server name, route) in arrival order
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, port: int | None = None) -> "FakeVllm":
        app = web.Application()
        app.add_routes([web.post("/inference/v1/generate", self.generate), web.get("/health", self.health),
                        web.get("/weight_info", self.weight_info), web.post("/{name}", self.control),
                        web.post("/v1/load_lora_adapter", self.load_lora_adapter),
                        web.get("/get_world_size", self.world_size), web.get("/v1/models", self.list_models)])
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        port = port or free_port()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def health(self, request):
        return web.json_response({})

    async def weight_info(self, request):
        return web.json_response({"weight_version": self.version})

    async def list_models(self, request):
        """vLLM's list: the base model, then every loaded adapter with the base as its parent."""
        cards = [{"id": "policy", "object": "model", "parent": None}]
        cards += [{"id": name, "object": "model", "parent": "policy"} for name in sorted(self.adapters)]
        return web.json_response({"object": "list", "data": cards})

    async def world_size(self, request):
        self.calls.append(("get_world_size", dict(request.query)))
        return web.json_response({"world_size": self.world})

    async def control(self, request):
        name = request.match_info["name"]
        body = await request.json() if request.can_read_body else {}
        if request.query_string:
            name = f"{name}?{request.query_string}"
        self.calls.append((name, body))
        if self.log is not None:
            self.log.append((self.name, name))
        if name in self.hooks:
            await self.hooks[name](body)
        if self.control_delay_s:
            await asyncio.sleep(self.control_delay_s)
        if name in self.fail_control:
            return web.json_response({"error": "injected"}, status=500)
        if name == "update_weight_version":
            self.version = body["new_version"]
        if name == "finish_weight_update" and body.get("weight_version") is not None:
            self.version = body["weight_version"]
        return web.json_response({"status": "ok"})

    async def load_lora_adapter(self, request):
        """vLLM's answer: plain text; a 404 where runtime adapter loading is off (the route does not exist)."""
        if not self.lora_loading:
            return web.Response(status=404, text="Not Found")
        body = await request.json()
        self.calls.append(("load_lora_adapter", body))
        self.adapters.add(body["lora_name"])
        return web.Response(text=f"Success: LoRA adapter '{body['lora_name']}' added successfully.")

    async def generate(self, request):
        body = await request.json()
        self.models.append(body.get("model"))
        self.sampling_params.append(body["sampling_params"])
        if body.get("model") not in (None, "policy", *self.adapters):
            return web.json_response({"error": f"The model `{body['model']}` does not exist."}, status=404)
        if self.drop_connections > 0:
            self.drop_connections -= 1
            request.transport.close()  # what a server closing an idle keep-alive connection looks like
            return web.Response()
        self.in_flight += 1
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.fail_status:
                return web.json_response({"error": "injected"}, status=self.fail_status)
            if self.garbage:
                return web.json_response({"choices": [{"token_ids": [1, 2]}]})
            n = body["sampling_params"]["max_tokens"]
            allowed = body["sampling_params"].get("allowed_token_ids") or [7]
            tokens = [allowed[0]] * n
            self.served += 1
            prompt = body["token_ids"]
            scored = ([None] + [{str(t): {"logprob": self.prompt_logprob, "rank": 1}} for t in prompt[1:]]
                      if body["sampling_params"].get("prompt_logprobs") is not None else None)
            return web.json_response({"prompt_logprobs": scored, "choices": [{
                "token_ids": tokens, "finish_reason": "length",
                "logprobs": {"content": [{"token_id": t, "logprob": -0.25} for t in tokens]},
                "weight_versions": [{"version": self.version, "start": 0, "end": n}]}]})
        finally:
            self.in_flight -= 1
