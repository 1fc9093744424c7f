"""`turnstream keygen DIR`: the CURVE key directory that `network.keys_dir` points at (protocol/auth.py).

One server pair and one client pair; the client's public key is copied into allowed_clients/, so the
directory works as it is. For per-actor keys, run keygen again elsewhere and copy that client.key into
allowed_clients/ under another name: removing a file there revokes that client at its next connect.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import zmq.auth

from turnstream.protocol.auth import ALLOWED_DIR, CLIENT_SECRET, SERVER_SECRET


def main(directory: str | Path) -> int:
    d = Path(directory)
    existing = [name for name in (SERVER_SECRET, CLIENT_SECRET) if (d / name).exists()]
    if existing:  # overwriting would silently lock out every peer that holds the old keys
        print(f"turnstream keygen: {d} already holds {', '.join(existing)}; not overwriting")
        return 1
    d.mkdir(parents=True, exist_ok=True)
    (d / ALLOWED_DIR).mkdir(exist_ok=True)
    old_umask = os.umask(0o077)  # secrets are created readable by their owner only, never world-readable
    try:
        zmq.auth.create_certificates(d, "server")
        client_public, _ = zmq.auth.create_certificates(d, "client")
    finally:
        os.umask(old_umask)
    for public in ("server.key", "client.key"):
        os.chmod(d / public, 0o644)  # public keys may be shared freely
    shutil.copyfile(client_public, d / ALLOWED_DIR / "client.key")
    print(f"wrote {d}: server.key, {SERVER_SECRET}, client.key, {CLIENT_SECRET}, {ALLOWED_DIR}/client.key")
    return 0
