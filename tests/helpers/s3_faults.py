"""A small HTTP proxy on 127.0.0.1 between an S3 client and a local S3 server, which injects faults on request:
a burst of 503 SlowDown answers, a connection cut in the middle of an object, a slow object, or a delay on every
request (the benchmark's latency). It counts the requests it forwards per path, so tests see what was read."""

from __future__ import annotations

import http.client
import logging
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")


DENIED = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidAccessKeyId</Code>'
          b"<Message>The AWS Access Key Id you provided does not exist in our records.</Message></Error>")


class Faults:
    """What the proxy does to the next requests. Each rule is used up as it fires (bounded: no endless faults)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.slow_downs = 0  # the next N GET requests answer 503
        self.cuts: Counter[str] = Counter()  # path part -> GETs to cut half-way
        self.slow: dict[str, tuple[float, int]] = {}  # path part -> (seconds to wait before answering, how many GETs)
        self.deny_key: str | None = None  # requests signed with this access key id answer 403 InvalidAccessKeyId
        self.delay_s = 0.0  # added to every request
        self.fired: Counter[str] = Counter()
        self.gets: Counter[str] = Counter()  # path -> GET requests that got their whole answer

    def slow_for(self, method: str, path: str) -> float:
        with self.lock:
            for part, (seconds, count) in list(self.slow.items()):
                if method == "GET" and part in path and count > 0:
                    self.slow[part] = (seconds, count - 1)
                    self.fired["slow"] += 1
                    return seconds
        return 0.0

    def take(self, method: str, path: str) -> str | None:
        with self.lock:
            if method != "GET":
                return None
            if self.slow_downs > 0:
                self.slow_downs -= 1
                self.fired["503"] += 1
                return "503"
            for part in list(self.cuts):
                if part in path and self.cuts[part] > 0:
                    self.cuts[part] -= 1
                    self.fired["cut"] += 1
                    return "cut"
        return None


def quiet_error(request: object, client_address: object) -> None:
    """A request that failed in a server thread (a connection the faults cut, a client gone mid-answer) logged at
    debug level: socketserver's default prints its traceback on ``sys.stderr``, and a test that reads what a command
    wrote there (with ``redirect_stderr``) would read another thread's traceback as the command's."""
    logging.getLogger("local-s3").debug("request from %s failed", client_address, exc_info=True)


class QuietServer(ThreadingHTTPServer):
    """A threading HTTP server whose failed requests are logged, not printed (:func:`quiet_error`)."""

    def handle_error(self, request: object, client_address: object) -> None:
        quiet_error(request, client_address)


class SharedPortServer(QuietServer):
    """A server whose port other processes may listen on too (``SO_REUSEPORT``): the kernel hands each new
    connection to one of them, as a load balancer spreads clients over an object store's front ends."""

    allow_reuse_port = True


class FaultProxy:
    """Forwards every request to ``upstream`` (``http://127.0.0.1:PORT``) with :class:`Faults` applied; listens on
    ``port`` (0: a free one), shared with other processes' proxies when ``shared``."""

    def __init__(self, upstream: str, port: int = 0, shared: bool = False) -> None:
        self.faults = Faults()
        target = urlsplit(upstream)
        faults = self.faults

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body leave in two writes: without this, Nagle's algorithm holds the body back until the
            # client's delayed ACK of the headers (~40 ms a request, more than the latency the benchmark adds).
            disable_nagle_algorithm = True

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if faults.delay_s:
                    time.sleep(faults.delay_s)
                time.sleep(faults.slow_for(self.command, self.path))
                if faults.deny_key and f"Credential={faults.deny_key}/" in self.headers.get("Authorization", ""):
                    self._answer(403, {"Content-Type": "application/xml"}, DENIED)
                    return
                fault = faults.take(self.command, self.path)
                if fault == "503":
                    self._answer(503, {"Content-Type": "application/xml"}, SLOW_DOWN)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() != "content-length"}
                answer, data = self._upstream(body, headers)
                # A HEAD answer's length is the object's, not its (empty) body's.
                dropped = ("transfer-encoding", "connection") + (() if self.command == "HEAD" else ("content-length",))
                out = {k: v for k, v in answer.getheaders() if k.lower() not in dropped}
                status = answer.status
                if fault == "cut" and len(data) > 1:
                    self._cut(status, out, data)
                    return
                if self.command == "GET" and status < 300:
                    with faults.lock:
                        faults.gets[self.path.split("?")[0]] += 1
                self._answer(status, out, data)

            def _upstream(self, body: bytes | None, headers: dict) -> tuple[http.client.HTTPResponse, bytes]:
                """The server's answer, on this client connection's own connection to it (opened again once if it was closed)."""
                for attempt in range(2):
                    conn = getattr(self, "upstream_conn", None)
                    if conn is None:
                        conn = self.upstream_conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                    try:
                        conn.request(self.command, self.path, body=body, headers=headers)
                        answer = conn.getresponse()
                        return answer, answer.read()
                    except (http.client.HTTPException, OSError):
                        conn.close()
                        self.upstream_conn = None
                        if attempt:
                            raise
                raise AssertionError("unreachable")

            def finish(self) -> None:
                super().finish()
                if getattr(self, "upstream_conn", None) is not None:
                    self.upstream_conn.close()

            def _answer(self, status: int, headers: dict, data: bytes) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _cut(self, status: int, headers: dict, data: bytes) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self.server = (SharedPortServer if shared else QuietServer)(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
