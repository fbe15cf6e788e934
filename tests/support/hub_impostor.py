"""An endpoint that answers every Hub request with 200 and the same body that is not the Hub's answer: an HTML page
(a captive portal, a proxy's login page), an empty JSON object, or JSON cut short. For the tests that every command
which talks to the Hub says so in one line (`with ImpostorServer("html") as s, s.activate(): ...`).

Deliberately not done: anything the Hub does; it reads the request line and headers and ignores them.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from support.hub_server import HubServer

ANSWERS: dict[str, tuple[str, bytes]] = {
    "html": (
        "text/html",
        b"<!DOCTYPE html><html><head><title>Sign in to the network</title></head><body></body></html>",
    ),
    "empty": ("application/json", b"{}"),
    "truncated": ("application/json", b'{"id": "org/repo", "sha": "0123456789abcdef", "siblings": [{"rfilena'),
}


class ImpostorServer(HubServer):
    """Answers every request (any method, any path) with 200 and ANSWERS[kind]."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> ImpostorServer:
        if self._server is None:
            content_type, body = ANSWERS[self.kind]

            class Handler(BaseHTTPRequestHandler):
                def _answer(self) -> None:
                    length = int(self.headers.get("Content-Length") or 0)
                    if length:
                        self.rfile.read(length)
                    self.send_response(200)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(body)

                do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _answer

                def log_message(self, *args: object) -> None:
                    pass

            self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            self._server.daemon_threads = True
            self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
            threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
