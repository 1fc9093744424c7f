"""The vLLM server list a run can change while it runs: a text file of URLs, one a line.

The launcher writes it (`<run_dir>/vllm_urls.txt`, or `vllm.urls_file`); actors send requests to the servers
it names and the learner pushes weights to them. Add a server by appending its URL (the learner brings it
to the current weights, actors use it once its version is within the staleness bound); remove one by
deleting its line (actors drain it, the learner stops pushing to it).
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Callable


def read_urls_file(path: Path) -> list[str] | None:
    """Server URLs, one a line (# comments allowed); None if the file cannot be read or names no server."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    urls = [ln.split("#", 1)[0].strip() for ln in lines]
    urls = [u for u in urls if u.startswith(("http://", "https://"))]
    return urls or None


def write_urls_file(path: Path, urls: list[str]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("# vLLM servers of this run, one a line; actors and the learner re-read this file\n"
                   + "".join(f"{url}\n" for url in urls))
    tmp.replace(path)  # atomic: the roles may read it at any moment


async def watch_urls_file(path: Path, apply: Callable[[list[str]], None], interval_s: float) -> None:
    """Call `apply(urls)` whenever the file names a different set of servers; an unreadable or empty file
    keeps the current set (a half-written edit must not empty the fleet)."""
    last: list[str] | None = None
    while True:
        urls = read_urls_file(path)
        if urls is not None and urls != last:
            apply(urls)
            last = urls
        await asyncio.sleep(interval_s)
