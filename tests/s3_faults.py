"""A small fault-injecting HTTP/1.1 proxy on loopback, in front of an S3 server.

For a share ``rate`` of the requests (chosen by a seeded random generator, so the
sequence of decisions is the same in every run; ``methods`` and ``limit`` narrow it
down) it injects one of ``kinds``:

* ``"503"``: answers ``503 SlowDown`` with an S3 XML error body (the request never
  reaches the server);
* ``"500"``: answers ``500 InternalError`` likewise;
* ``"reset"``: resets the connection (TCP RST) before forwarding anything;
* ``"reset_mid"``: forwards the request (the server carries it out), then relays half of
  the response body, or nothing of a response without one, and resets the connection:
  a read broken mid-stream, or a write whose answer is lost;
* ``"delay"``: waits ``delay_s`` seconds, then forwards the request normally.

Everything else is relayed as is (keep-alive, ``Expect: 100-continue``, chunked or
sized bodies). ``injected`` counts what was injected, by kind; ``requests`` counts every
request seen. Threads and plain sockets; every loop is bounded by a socket timeout or
by the bytes a message declares; ``stop()`` closes every socket and joins every thread.
"""
from __future__ import annotations

import collections
import random
import socket
import struct
import threading
import time
from typing import Dict, Iterable, Optional, Tuple

KINDS = ("503", "500", "reset", "reset_mid", "delay")
_MAX_HEAD = 64 << 10
_BLOCK = 256 << 10
_ERRORS = {"503": ("503 Service Unavailable", "SlowDown", "Please reduce your request rate."),
           "500": ("500 Internal Server Error", "InternalError",
                   "We encountered an internal error. Please try again.")}


class FaultProxy:
    def __init__(self, upstream_port: int, *, upstream_host: str = "127.0.0.1",
                 rate: float = 0.0, kinds: Iterable[str] = ("503", "500", "reset"),
                 seed: int = 0, delay_s: float = 0.2, methods: Optional[Iterable[str]] = None,
                 limit: Optional[int] = None, path_contains: Optional[str] = None,
                 timeout_s: float = 30.0):
        self.upstream = (upstream_host, upstream_port)
        self.timeout_s = timeout_s
        self.delay_s = delay_s
        self.injected: Dict[str, int] = collections.Counter()
        self.requests = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads = set()
        self._sockets = set()
        self.configure(rate=rate, kinds=kinds, seed=seed, methods=methods, limit=limit,
                       path_contains=path_contains)
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept_loop, name="fault-proxy",
                                          daemon=True)
        self._acceptor.start()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def configure(self, *, rate: Optional[float] = None, kinds: Optional[Iterable[str]] = None,
                  seed: Optional[int] = None, methods: Optional[Iterable[str]] = None,
                  limit: Optional[int] = None, path_contains: Optional[str] = None) -> None:
        """Changes what is injected from the next request on. ``methods``: only requests
        of these HTTP methods get faults (None: all); ``path_contains``: only requests
        whose target (path and query) holds this text; ``limit``: at most this many more
        faults (None: no limit)."""
        with self._lock:
            if rate is not None:
                assert 0.0 <= rate <= 1.0
                self.rate = rate
            if kinds is not None:
                kinds = tuple(kinds)
                assert kinds and set(kinds) <= set(KINDS), kinds
                self.kinds = kinds
            if seed is not None:
                self._rng = random.Random(seed)
            self.methods = None if methods is None else {m.upper() for m in methods}
            self._left = limit
            self.path_contains = path_contains

    def total_injected(self) -> int:
        with self._lock:
            return sum(self.injected.values())

    def _decide(self, method: str, target: str) -> Optional[str]:
        with self._lock:
            self.requests += 1
            if self.methods is not None and method not in self.methods:
                return None
            if self.path_contains is not None and self.path_contains not in target:
                return None
            if self._left == 0 or self._rng.random() >= self.rate:
                return None
            if self._left is not None:
                self._left -= 1
            kind = self._rng.choice(self.kinds)
            self.injected[kind] += 1
            return kind

    # --- life cycle ----------------------------------------------------------------------
    def __enter__(self) -> "FaultProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopping.set()
        self._acceptor.join(5)
        self._listener.close()
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in threads:
            t.join(10)

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True,
                                 name="fault-proxy-conn")
            with self._lock:
                self._threads = {x for x in self._threads if x.is_alive()}
                self._threads.add(t)
            t.start()

    def _track(self, s: socket.socket) -> socket.socket:
        s.settimeout(self.timeout_s)
        with self._lock:
            self._sockets.add(s)
        return s

    # --- one client connection -------------------------------------------------------------
    def _serve(self, client: socket.socket) -> None:
        upstream = reader = up_reader = None
        try:
            self._track(client)
            reader = client.makefile("rb")
            while not self._stopping.is_set():
                request = _read_head(reader)
                if request is None:
                    return
                method, _, headers = _parse_head(request)
                fault = self._decide(method, request.split(b" ", 2)[1].decode("latin-1"))
                if fault == "reset":
                    return _reset(client)
                expect = headers.get("expect", "").lower() == "100-continue"
                if fault in _ERRORS:
                    if not expect:  # the body is on its way: take it before answering
                        _copy_body(reader, None, headers)
                    client.sendall(_error_response(fault, method))
                    return _close_gently(client)
                if fault == "delay":
                    time.sleep(self.delay_s)
                if upstream is None:
                    upstream = self._track(socket.create_connection(self.upstream,
                                                                    self.timeout_s))
                    up_reader = upstream.makefile("rb")
                if expect:  # answer the client's Expect here; the server gets the body at once
                    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    request = _drop_header(request, b"expect")
                upstream.sendall(request)
                _copy_body(reader, upstream, headers)
                response = _read_head(up_reader)
                if response is None:
                    return _reset(client)
                _, status, rheaders = _parse_head(response)
                no_body = method == "HEAD" or status in (204, 304) or 100 <= status < 200
                if fault == "reset_mid":
                    size = int(rheaders.get("content-length", "0") or 0)
                    if not no_body and size > 1:
                        client.sendall(response)
                        _copy_body(up_reader, client, rheaders, limit=size // 2)
                    return _reset(client)
                client.sendall(response)
                until_close = (not no_body and "content-length" not in rheaders
                               and "chunked" not in rheaders.get("transfer-encoding", ""))
                if not no_body:
                    _copy_body(up_reader, client, rheaders, until_close=until_close)
                if until_close or "close" in (rheaders.get("connection", "")
                                              + headers.get("connection", "")).lower():
                    return
        except (OSError, ValueError):
            return
        finally:
            for f in (reader, up_reader):  # a socket closes once its files are closed too
                if f is not None:
                    try:
                        f.close()
                    except OSError:
                        pass
            for s in (client, upstream):
                if s is not None:
                    with self._lock:
                        self._sockets.discard(s)
                    try:
                        s.close()
                    except OSError:
                        pass


def _read_head(reader) -> Optional[bytes]:
    """One message's start line and headers (through the blank line); None at EOF."""
    lines = []
    total = 0
    while True:
        line = reader.readline(_MAX_HEAD)
        if not line:
            if lines:
                raise ValueError("connection closed inside a message head")
            return None
        total += len(line)
        if total > _MAX_HEAD:
            raise ValueError("message head too large")
        if not lines and line in (b"\r\n", b"\n"):
            continue  # tolerate a stray blank line between messages
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)


def _parse_head(head: bytes) -> Tuple[str, int, Dict[str, str]]:
    """(method or "", status or 0, lower-cased headers) of a request or response head."""
    first, *rest = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in rest:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    words = first.split(" ")
    if words[0].startswith("HTTP/"):
        return "", int(words[1]), headers
    return words[0].upper(), 0, headers


def _drop_header(head: bytes, name: bytes) -> bytes:
    lines = head.split(b"\r\n")
    return b"\r\n".join(x for x in lines if not x.lower().startswith(name + b":"))


def _copy_body(reader, dst: Optional[socket.socket], headers: Dict[str, str], *,
               limit: Optional[int] = None, until_close: bool = False) -> None:
    """Relays (or, with no ``dst``, discards) one message body: sized, chunked, or up to
    the end of the connection; at most ``limit`` bytes of a sized one."""
    def send(data):
        if dst is not None and data:
            dst.sendall(data)

    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            line = reader.readline(_MAX_HEAD)
            if not line:
                raise ValueError("connection closed inside a chunked body")
            send(line)
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                break
            _copy_exact(reader, send, size + 2)  # the chunk and its CRLF
        while True:  # trailers, through the blank line
            line = reader.readline(_MAX_HEAD)
            send(line)
            if line in (b"\r\n", b"\n", b""):
                return
    if until_close:
        while True:
            data = reader.read1(_BLOCK)
            if not data:
                return
            send(data)
    size = int(headers.get("content-length", "0") or 0)
    _copy_exact(reader, send, size if limit is None else min(size, limit))


def _copy_exact(reader, send, n: int) -> None:
    while n > 0:
        data = reader.read1(min(n, _BLOCK))
        if not data:
            raise ValueError("connection closed inside a body")
        send(data)
        n -= len(data)


def _error_response(kind: str, method: str) -> bytes:
    status, code, message = _ERRORS[kind]
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message} (injected by the test proxy)</Message>"
            f"<RequestId>uckpt-fault-proxy</RequestId></Error>").encode()
    if method == "HEAD":
        body = b""
    head = (f"HTTP/1.1 {status}\r\nContent-Type: application/xml\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    return head + body


def _reset(s: socket.socket) -> None:
    """Closes ``s`` with a TCP RST (SO_LINGER 0) instead of an orderly FIN."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass


def _close_gently(s: socket.socket) -> None:
    """Sends FIN after an answer and waits briefly for the client to close, so that the
    answer is read before the socket goes (closing with unread input would reset it)."""
    try:
        s.shutdown(socket.SHUT_WR)
        s.settimeout(2.0)
        for _ in range(64):
            if not s.recv(_BLOCK):
                break
    except OSError:
        pass
