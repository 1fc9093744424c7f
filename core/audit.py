"""Optional audit trail of what each role did with which data, for the fault-injection tests.

Off by default; `TURNSTREAM_AUDIT=1` in a role's environment turns it on. The buffer (buffer/audit.py)
then appends a line per acked chunk key and per served or dropped episode to
`<run_dir>/audit/buffer.jsonl`, the learner (learner/listeners.py) a line per trained batch to
`<run_dir>/audit/learner.jsonl`; tests/fault/ joins them to check that no acked chunk is lost and no
episode is trained twice. Every process start writes a `start` line first, so incarnations can be told
apart after a restart.

Lines are written with one os.write on an O_APPEND descriptor (no user-space buffer), so what was written
survives `kill -9` of the writer, as the buffer's write-ahead log does.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

ENV_VAR = "TURNSTREAM_AUDIT"


def audit_path(run_dir: str | Path, role: str) -> Path | None:
    """Where `role` writes its audit lines, or None when auditing is off."""
    if os.environ.get(ENV_VAR, "") not in ("1", "true", "yes"):
        return None
    path = Path(run_dir) / "audit" / f"{role}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


class AuditLog:
    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.write({"start": os.getpid(), "time": time.time()})

    def write(self, *records: dict) -> None:
        if records:
            os.write(self.fd, "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode())

    def close(self) -> None:
        os.close(self.fd)


def open_audit(run_dir: str | Path, role: str) -> AuditLog | None:
    path = audit_path(run_dir, role)
    return AuditLog(path) if path is not None else None
