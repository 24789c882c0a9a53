"""A local model hub: a small HTTP server speaking the part of the Hugging Face hub's API that
huggingface_hub's `snapshot_download` uses (repo info, the recursive tree listing, the
`resolve` downloads with their commit/etag headers), serving model folders from disk.

Tests point `HF_ENDPOINT` at it, so `gridrun fetch` runs its real download path (the real
huggingface_hub, the real cache layout) on a machine that cannot reach the hub. Every
request is counted, so a test can say that a second fetch downloaded nothing.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


@dataclass
class Mirror:
    """repo id -> its folder on disk; `requests` counts (method, kind) of what was asked."""

    repos: dict[str, Path]
    url: str = ""
    requests: Counter[tuple[str, str]] = field(default_factory=Counter)

    def commit(self, repo_id: str) -> str:
        """A stable 40-hex commit per repo and content."""
        digest = hashlib.sha1(repo_id.encode())
        for path in sorted(self.files(repo_id)):
            digest.update(path.encode() + (self.repos[repo_id] / path).read_bytes())
        return digest.hexdigest()

    def files(self, repo_id: str) -> list[str]:
        root = self.repos[repo_id]
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())

    @property
    def downloads(self) -> int:
        return self.requests["GET", "resolve"]


def _handler(mirror: Mirror) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for key, value in {"Content-Length": str(len(body)), **headers}.items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, data: object) -> None:
            self._send(200, json.dumps(data).encode(), {"Content-Type": "application/json"})

        def _missing(self) -> None:
            self._send(404, b'{"error": "Repository not found"}',
                       {"Content-Type": "application/json", "X-Error-Code": "RepoNotFound"})

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            path = unquote(urlparse(self.path).path)
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                repo_id = "/".join(parts[2:4])
                kind = parts[4] if len(parts) > 4 else "info"
                mirror.requests[self.command, kind] += 1
                if repo_id not in mirror.repos:
                    return self._missing()
                commit = mirror.commit(repo_id)
                if kind == "tree":
                    root = mirror.repos[repo_id]
                    return self._json([
                        {"type": "file", "path": name, "size": (root / name).stat().st_size,
                         "oid": hashlib.sha1((root / name).read_bytes()).hexdigest()}
                        for name in mirror.files(repo_id)
                    ])
                return self._json({"id": repo_id, "sha": commit, "private": False,
                                   "siblings": [{"rfilename": name} for name in mirror.files(repo_id)]})
            if len(parts) >= 5 and parts[2] == "resolve":
                repo_id, name = "/".join(parts[:2]), "/".join(parts[4:])
                mirror.requests[self.command, "resolve"] += 1
                if repo_id not in mirror.repos or not (mirror.repos[repo_id] / name).is_file():
                    return self._missing()
                body = (mirror.repos[repo_id] / name).read_bytes()
                return self._send(200, body, {
                    "X-Repo-Commit": mirror.commit(repo_id),
                    "ETag": f'"{hashlib.sha1(body).hexdigest()}"',
                    "Content-Type": "application/octet-stream",
                })
            mirror.requests[self.command, "other"] += 1
            self._missing()

    return Handler


@contextmanager
def serve(repos: dict[str, Path]) -> Iterator[Mirror]:
    """A running mirror of `repos` on a free local port (its base URL in `.url`)."""
    mirror = Mirror(repos)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(mirror))
    mirror.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield mirror
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
