"""A fault-injecting proxy in front of the local cluster's API server, for the fault suite: the
operator and the frontend are pointed at it (KUBERNETES_SERVICE_HOST/PORT), and it answers a
share of their requests with an error (500, 503, 429 with Retry-After, 504) or holds them for a
while before passing them on, as an overloaded or partitioned API server would.

It terminates TLS with the API server's own serving certificate (valid for the node address) and
speaks HTTP/1.1 only (ALPN), one request per connection (`Connection: close` added), so each
request can be judged on its own; upgraded connections (the attach stream) and watches are
passed through as they are, once let through.
"""

from __future__ import annotations

import asyncio
import json
import random
import ssl
import threading

PKI = "/var/lib/sandboxrun-cluster/pki"


class FaultProxy:
    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int], pki: str = PKI):
        self.listen, self.upstream = listen, upstream
        self.errors = 0.0        # share of requests answered with an error
        self.hangs = 0.0         # share of requests held before they are passed on
        self.hang_seconds = 8.0
        self.counts = {"passed": 0, "errors": 0, "held": 0}
        self._server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._server_ctx.load_cert_chain(f"{pki}/apiserver.crt", f"{pki}/apiserver.key")
        self._server_ctx.set_alpn_protocols(["http/1.1"])
        self._client_ctx = ssl.create_default_context(cafile=f"{pki}/ca.crt")
        self._client_ctx.set_alpn_protocols(["http/1.1"])
        self._rng = random.Random(7)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "FaultProxy":
        self._thread.start()
        self._ready.wait(10)
        return self

    def set(self, errors: float = 0.0, hangs: float = 0.0, hang_seconds: float = 8.0) -> None:
        self.errors, self.hangs, self.hang_seconds = errors, hangs, hang_seconds

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def serve():
            server = await asyncio.start_server(self._handle, *self.listen, ssl=self._server_ctx)
            self._ready.set()
            async with server:
                await server.serve_forever()

        self._loop.run_until_complete(serve())

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        lines = head.decode("latin-1").split("\r\n")
        headers = {l.split(":", 1)[0].strip().lower(): l.split(":", 1)[1].strip()
                   for l in lines[1:] if ":" in l}
        body = b""
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        upgrade = "upgrade" in headers.get("connection", "").lower()
        roll = self._rng.random()
        if roll < self.errors:
            self.counts["errors"] += 1
            code, reason = self._rng.choice([(500, "InternalError"), (503, "ServiceUnavailable"),
                                             (429, "TooManyRequests"), (504, "Timeout")])
            status = json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                 "status": "Failure", "message": "injected by the fault proxy",
                                 "reason": reason, "code": code}).encode()
            extra = "Retry-After: 1\r\n" if code == 429 else ""
            writer.write(f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(status)}\r\n{extra}Connection: close\r\n\r\n"
                         .encode() + status)
            await self._close(writer)
            return
        if roll < self.errors + self.hangs:
            self.counts["held"] += 1
            await asyncio.sleep(self.hang_seconds)
        else:
            self.counts["passed"] += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(
                *self.upstream, ssl=self._client_ctx, server_hostname=self.upstream[0])
        except OSError:
            await self._close(writer)
            return
        if not upgrade:
            kept = [l for l in lines[1:] if l and not l.lower().startswith("connection:")]
            head = ("\r\n".join([lines[0], *kept, "Connection: close"]) + "\r\n\r\n").encode("latin-1")
        up_writer.write(head + body)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            await FaultProxy._close(dst)

    @staticmethod
    async def _close(writer: asyncio.StreamWriter) -> None:
        try:
            writer.close()
            await writer.wait_closed()
        except (ConnectionError, ssl.SSLError):
            pass
