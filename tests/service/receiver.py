"""A webhook receiver for the tests: a real HTTP server on loopback (http.server in a thread) that records
every request and answers as scripted, and checks each body's signature as a user's receiver would."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.body)
        return value

    def signed_with(self, secret: str) -> bool:
        """What a receiver checks: the header is the HMAC-SHA256 of the raw body, compared in constant time."""
        expected = "sha256=" + hmac.new(secret.encode(), self.body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, self.headers.get("x-pipebd-signature", ""))


@dataclass
class Receiver:
    """Answers each request to a path with the next status scripted for it (200 once its script is used
    up); a scripted "slow" sleeps `slow_s` before answering 200, past the sender's timeout."""

    server: ThreadingHTTPServer
    scripts: dict[str, deque[int | str]] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    slow_s: float = 2.0
    before_answer: Callable[[Received], None] | None = None  # called with each request before it is answered

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def script(self, path: str, *answers: int | str) -> str:
        """Answer requests to `path` with `answers` in turn; the URL of `path`."""
        self.scripts[path] = deque(answers)
        return self.url + path

    def on(self, path: str) -> list[Received]:
        return [request for request in self.received if request.path == path]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_receiver() -> Receiver:
    receiver: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            headers = {key.lower(): value for key, value in self.headers.items()}
            receiver.received.append(Received(self.path, headers, body))
            if receiver.before_answer is not None:
                receiver.before_answer(receiver.received[-1])
            script = receiver.scripts.get(self.path)
            answer = script.popleft() if script else 200
            if answer == "slow":
                time.sleep(receiver.slow_s)
                answer = 200
            try:
                self.send_response(int(answer))
                self.end_headers()
                self.wfile.write(b"scripted answer")
            except (BrokenPipeError, ConnectionResetError):  # a sender that timed out has hung up
                pass

        def log_message(self, format: str, *args: Any) -> None:  # keep the test output quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver = Receiver(server)
    threading.Thread(target=server.serve_forever, name="receiver", daemon=True).start()
    return receiver
