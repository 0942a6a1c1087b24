"""A proxy on loopback in front of an object-storage server that fails some of its requests the
way stores do: ``503 SlowDown``, ``500 InternalError``, or the connection dropped before an
answer (``reset``); after the store acted, its answer lost (``lost``: the request reached the
store and did its work, the client sees a reset) or cut in the middle (``cut``: the status line
and part of the rest, then a reset); or that is down (refuses connections) for a while. Real
sockets, real HTTP: the client under test (pyarrow's S3 client, boto3) sees exactly what a flaky
store sends. ``only`` limits the faults to requests whose first line contains it (``b"uploadId="``:
the parts and completion of multipart uploads).

    with FaultProxy(upstream="127.0.0.1:PORT", rate=0.05, seed=1) as proxy:
        env = {**store.env, "AWS_ENDPOINT_URL": proxy.url, "AWS_ENDPOINT_URL_S3": proxy.url}
        ...
        proxy.down(30)             # refuse every connection for 30 s
        print(proxy.counts)        # {"forwarded": .., "503": .., "500": .., "reset": .., "refused": ..}

One request per connection (the answer says ``Connection: close``), so every request is a fresh
draw. The draws come from one seeded generator in request order.
"""
from __future__ import annotations

import random
import socket
import struct
import threading
import time

HOST = "127.0.0.1"
KINDS = ("503", "500", "reset")
AFTER_KINDS = ("lost", "cut")      # the store acted; its answer did not arrive whole
_ERRORS = {"503": (b"503 Slow Down", b"SlowDown", b"Please reduce your request rate."),
           "500": (b"500 Internal Server Error", b"InternalError", b"We encountered an internal error."),
           "403": (b"403 Forbidden", b"AccessDenied", b"Access Denied"),      # permanent: for tests that it is not retried
           # an S3-compatible store without conditional writes (If-None-Match / If-Match)
           "501": (b"501 Not Implemented", b"NotImplemented",
                   b"A header you provided implies functionality that is not implemented."),
           "NoSuchUpload": (b"404 Not Found", b"NoSuchUpload", b"The specified multipart upload does not exist.")}


def _read_until(sock, buf: bytes, marker: bytes) -> tuple[bytes, bytes]:
    while marker not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    head, _, rest = buf.partition(marker)
    return head, rest


def _read_exact(sock, buf: bytes, n: int) -> tuple[bytes, bytes]:
    while len(buf) < n:
        chunk = sock.recv(max(65536, n - len(buf)))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf[:n], buf[n:]


def _read_chunked(sock, buf: bytes) -> bytes:
    """The raw bytes of a chunked body (chunks and trailer, as sent)."""
    out = b""
    while True:
        line, buf = _read_until(sock, buf, b"\r\n")
        out += line + b"\r\n"
        size = int(line.split(b";")[0], 16)
        if size == 0:
            while True:                      # trailer lines up to an empty one
                line, buf = _read_until(sock, buf, b"\r\n")
                out += line + b"\r\n"
                if not line:
                    return out
        data, buf = _read_exact(sock, buf, size + 2)
        out += data


def read_request(sock) -> bytes:
    """One whole HTTP request from SOCK, as bytes, with 'Connection: close' set."""
    head, rest = _read_until(sock, b"", b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if headers.get(b"expect", b"").lower() == b"100-continue":
        sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")     # else the client waits a second before the body
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        body = _read_chunked(sock, rest)
    else:
        body, _ = _read_exact(sock, rest, int(headers.get(b"content-length", b"0")))
    kept = [line for line in lines[1:] if not line.lower().startswith((b"connection:", b"expect:"))]
    return b"\r\n".join([lines[0], *kept, b"Connection: close"]) + b"\r\n\r\n" + body


class FaultProxy:
    """See the module doc. RATE: the share of requests that fail, spread evenly over KINDS."""

    def __init__(self, upstream: str, rate: float = 0.0, seed: int = 0, kinds: tuple = KINDS, only: bytes = b"",
                 limit: int | None = None, like_minio: bool = False, no_conditional: bool | bytes = False,
                 ignore_conditional: bool = False):
        """LIKE_MINIO: a multipart upload completed once is forgotten, as MinIO and Ceph forget
        it: completing it again answers 404 NoSuchUpload (AWS S3 and moto answer 200).
        NO_CONDITIONAL: a request with If-Match or If-None-Match answers 501 NotImplemented, as
        S3-compatible stores without conditional writes do (a method, b"DELETE": only its requests,
        as a store with conditional puts and no conditional deletes). IGNORE_CONDITIONAL: those
        headers are dropped on the way and the request applied unconditionally, as a store that
        accepts them and ignores them would."""
        self.upstream = upstream.replace("http://", "")
        self.rate, self.kinds, self.only, self.limit = rate, kinds, only, limit
        self.like_minio, self._completed = like_minio, set()
        self.no_conditional, self.ignore_conditional = no_conditional, ignore_conditional
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.counts = {"forwarded": 0, "refused": 0, **{k: 0 for k in (*KINDS, *AFTER_KINDS, "403", "501")}}
        self._down_until = 0.0
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def __enter__(self):
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((HOST, 0))
        self._listener.listen(128)
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True, name="fault-proxy")
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
        self._listener.close()
        return False

    def down(self, seconds: float) -> None:
        """Refuse every connection (closed with a reset before any answer) for SECONDS from now."""
        self._down_until = time.time() + seconds

    def _draw(self) -> str | None:
        with self._lock:
            if self.limit is not None and sum(self.counts[k] for k in (*KINDS, *AFTER_KINDS)) >= self.limit:
                return None
            if self._rng.random() < self.rate:
                return self._rng.choice(self.kinds)
            return None

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _count(self, kind: str) -> None:
        with self._lock:
            self.counts[kind] += 1

    @staticmethod
    def _reset(conn) -> None:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # RST, not FIN
        conn.close()

    def _handle(self, conn):
        try:
            if time.time() < self._down_until:
                self._count("refused")
                return self._reset(conn)
            request = read_request(conn)
            first = request.split(b"\r\n", 1)[0]
            upload = first.split(b"?uploadId=", 1)[1].split(b" ")[0] if first.startswith(b"POST") \
                and b"?uploadId=" in first else None
            head = request.split(b"\r\n\r\n", 1)[0].lower()
            method = first.split(b" ", 1)[0]
            if self.no_conditional and (self.no_conditional is True or self.no_conditional == method) \
                    and (b"\r\nif-match:" in head or b"\r\nif-none-match:" in head):
                kind = "501"
            elif upload is not None and self.like_minio and upload in self._completed:
                kind = "NoSuchUpload"
            else:
                kind = self._draw() if self.only in first else None
                if upload is not None:
                    self._completed.add(upload)
            if kind == "reset":
                self._count("reset")
                return self._reset(conn)
            if kind in _ERRORS:
                status, code, message = _ERRORS[kind]
                kind = "403" if kind == "NoSuchUpload" else kind           # counted with the permanent ones
                body = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>' + code + b"</Code><Message>" + message
                        + b"</Message><RequestId>fault-proxy</RequestId></Error>")
                self._count(kind)                   # before the answer: a client that has it sees the count
                conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/xml\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
                return conn.close()
            if self.ignore_conditional:
                head, sep, body = request.partition(b"\r\n\r\n")
                head = b"\r\n".join(line for line in head.split(b"\r\n")
                                     if not line.lower().startswith((b"if-match:", b"if-none-match:")))
                request = head + sep + body
            host, port = self.upstream.split(":")
            answer = b""
            with socket.create_connection((host, int(port)), timeout=60) as up:
                up.sendall(request)
                if kind not in AFTER_KINDS:
                    # counted before the answer goes back: a client that has its answer sees the count
                    self._count("forwarded")
                while True:
                    chunk = up.recv(65536)
                    if not chunk:
                        break
                    if kind in AFTER_KINDS:
                        answer += chunk                     # held: the store's whole answer first
                    else:
                        conn.sendall(chunk)
            if kind == "lost":
                self._count("lost")
                return self._reset(conn)
            if kind == "cut":
                head, _, _rest = answer.partition(b"\r\n")
                conn.sendall(head + b"\r\n" + answer[len(head) + 2:len(head) + 2 + 20])
                self._count("cut")
                return self._reset(conn)
            conn.close()
        except (ConnectionError, OSError):
            conn.close()
