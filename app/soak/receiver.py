"""The soak's webhook receiver: an HTTP server on a loopback port that answers every POST 204 and remembers
its X-PipeBD-Delivery id, and that the soak takes down (its socket closed: attempts are refused) and brings
back up on the same port."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from app.soak.service import free_port


class Receiver:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()  # a resumed soak's receiver answers on its first segment's port
        self.received: list[int] = []  # delivery ids answered 2xx, in the order they came
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    @property
    def up(self) -> bool:
        return self.server is not None

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                delivery = self.headers.get("X-PipeBD-Delivery", "")
                self.send_response(204)
                self.end_headers()
                if delivery.isdigit():
                    with receiver.lock:
                        receiver.received.append(int(delivery))

            def log_message(self, format: str, *args: object) -> None:  # quiet
                return

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="soak-receiver", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def ids(self) -> list[int]:
        with self.lock:
            return list(self.received)
