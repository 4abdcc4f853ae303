"""Bidirectional gRPC streams over HTTP/2 spoken directly: the load side of `bench ingest`.

Why not grpc.aio: a grpc.aio client spends about 0.3 ms of CPU per message sent and
acknowledged (a batch per read, a batch per write, a completion-queue hop and a future each),
so generating 20,000 nodes' 4,000 reports/s took more than the aggregator it measures, on
the same two cores. Here a message is one pre-encoded DATA frame appended to a buffer that is
flushed once per loop turn, and an acknowledgement is one frame parsed out of a socket read.

What it implements of RFC 9113, and what it leaves out:

1. the client preface and SETTINGS (no push; a 2 GiB receive window, so the server never
   waits for us), SETTINGS and PING acknowledged;
2. streams opened with one HEADERS frame whose block is HPACK literals and static-table
   indices only (RFC 7541), so no encoder state is needed;
3. the server's flow control honoured: DATA waits (in order, per connection) for the
   connection's and the stream's send window and is split at the server's frame size; at most
   the server's SETTINGS_MAX_CONCURRENT_STREAMS streams are opened on a connection;
4. frames from the server: DATA carries gRPC messages (5-byte length prefix) to the stream's
   `on_message`; HEADERS with END_STREAM (trailers), RST_STREAM, GOAWAY and a lost
   connection end the stream (`on_end` with the reason). Response headers are not decoded
   (no HPACK decoder: a status is not needed to count a stream that ended as a failure).
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Callable

__all__ = ["H2Connection", "H2Stream", "grpc_headers"]

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY, _WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
_END_STREAM, _ACK, _PADDED = 0x1, 0x1, 0x8
_END_HEADERS, _PRIORITY = 0x4, 0x20
_MAX_CONCURRENT_STREAMS, _INITIAL_WINDOW_SIZE, _MAX_FRAME_SIZE = 0x3, 0x4, 0x5
_DEFAULT_WINDOW = 65_535
_OUR_WINDOW = 2**31 - 1
_HEADER = struct.Struct(">I")


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return _HEADER.pack(len(payload))[1:] + bytes((kind, flags)) + _HEADER.pack(stream) + payload


def _hpack_string(text: str) -> bytes:
    raw = text.encode()
    if len(raw) >= 127:
        raise ValueError(f"header value {text[:40]!r}... too long for this encoder")
    return bytes((len(raw),)) + raw


def grpc_headers(authority: str, path: str) -> bytes:
    """The HPACK block of a gRPC request: static-table indices and literals without indexing."""
    return b"".join(
        (
            b"\x83",  # :method POST (static index 3)
            b"\x86",  # :scheme http (6)
            b"\x04" + _hpack_string(path),  # :path, name index 4, literal value
            b"\x01" + _hpack_string(authority),  # :authority (1)
            b"\x0f\x10" + _hpack_string("application/grpc"),  # content-type (31)
            b"\x00" + _hpack_string("te") + _hpack_string("trailers"),
        )
    )


class H2Stream:
    """One call. `on_message(bytes)` gets each response message, `on_end(reason)` its end."""

    __slots__ = ("_conn", "ended", "id", "on_end", "on_message", "received", "window")

    def __init__(
        self,
        conn: H2Connection,
        stream_id: int,
        on_message: Callable[[bytes], None],
        on_end: Callable[[str], None],
    ) -> None:
        self._conn = conn
        self.id = stream_id
        self.on_message = on_message
        self.on_end = on_end
        self.window = conn.peer_initial_window
        self.received = bytearray()
        self.ended = False

    def send(self, message: bytes) -> None:
        """Queue one gRPC message (uncompressed) for this stream."""
        if not self.ended:
            self._conn.send_data(self, b"\x00" + _HEADER.pack(len(message)) + message)

    def cancel(self) -> None:
        """RST_STREAM(CANCEL): the client ends the call; `on_end` is not called."""
        if not self.ended:
            self.ended = True
            self._conn.reset(self)


class H2Connection(asyncio.Protocol):
    """One HTTP/2 connection carrying many gRPC streams. Use `await H2Connection.open(...)`."""

    def __init__(self, header_block: bytes) -> None:
        self._header_block = header_block
        self._transport: asyncio.Transport | None = None
        self._in = bytearray()
        self._out: list[bytes] = []
        self._flush_pending = False
        self._pending: deque[tuple[H2Stream, memoryview]] = deque()
        self._streams: dict[int, H2Stream] = {}
        self._next_id = 1
        self._received = 0
        self.send_window = _DEFAULT_WINDOW
        self.peer_initial_window = _DEFAULT_WINDOW
        self.peer_max_frame = 16_384
        self.peer_max_streams = 2**31
        self.closed: str | None = None
        self.settled = asyncio.get_running_loop().create_future()

    @classmethod
    async def open(cls, host: str, port: int, header_block: bytes) -> H2Connection:
        """Connect and wait for the server's SETTINGS (so its limits are known)."""
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: cls(header_block), host, port)
        await asyncio.wait_for(asyncio.shield(conn.settled), 30)
        return conn

    @property
    def capacity(self) -> int:
        """How many more streams this connection may open."""
        if self.closed is not None:
            return 0
        return self.peer_max_streams - len(self._streams)

    def open_stream(
        self, on_message: Callable[[bytes], None], on_end: Callable[[str], None]
    ) -> H2Stream:
        """Start a call (HEADERS without END_STREAM); messages follow with `send`."""
        if self.closed is not None:
            raise ConnectionError(f"connection closed: {self.closed}")
        stream = H2Stream(self, self._next_id, on_message, on_end)
        self._next_id += 2
        self._streams[stream.id] = stream
        self._write(_frame(_HEADERS, _END_HEADERS, stream.id, self._header_block))
        return stream

    def close(self) -> None:
        """Close the socket; open streams end without `on_end`."""
        for stream in self._streams.values():
            stream.ended = True
        if self._transport is not None:
            self._flush()
            self._transport.close()

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        settings = struct.pack(">HIHI", 0x2, 0, _INITIAL_WINDOW_SIZE, _OUR_WINDOW)
        self._write(_PREFACE + _frame(_SETTINGS, 0, 0, settings))
        self._write(_window_update(0, _OUR_WINDOW - _DEFAULT_WINDOW))

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_all(f"connection lost: {exc or 'closed by the server'}")

    def data_received(self, data: bytes) -> None:
        buf = self._in
        buf += data
        at = 0
        while len(buf) - at >= 9:
            length = int.from_bytes(buf[at : at + 3], "big")
            end = at + 9 + length
            if len(buf) < end:
                break
            kind, flags = buf[at + 3], buf[at + 4]
            stream_id = int.from_bytes(buf[at + 5 : at + 9], "big") & 0x7FFF_FFFF
            self._on_frame(kind, flags, stream_id, bytes(buf[at + 9 : end]))
            at = end
        del buf[:at]

    # --- frames in -------------------------------------------------------------------------

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == _DATA:
            self._on_data(flags, stream_id, payload)
        elif kind == _HEADERS:
            if flags & _END_STREAM:  # trailers: the server ended the call
                self._end(stream_id, "the server ended the call (trailers)")
        elif kind == _WINDOW_UPDATE:
            increment = int.from_bytes(payload[:4], "big") & 0x7FFF_FFFF
            if stream_id == 0:
                self.send_window += increment
            elif (stream := self._streams.get(stream_id)) is not None:
                stream.window += increment
            self._drain()
        elif kind == _SETTINGS and not flags & _ACK:
            self._on_settings(payload)
        elif kind == _PING and not flags & _ACK:
            self._write(_frame(_PING, _ACK, 0, payload))
        elif kind == _RST_STREAM:
            code = int.from_bytes(payload[:4], "big")
            self._end(stream_id, f"RST_STREAM {_H2_ERRORS.get(code, code)}")
        elif kind == _GOAWAY:
            last = int.from_bytes(payload[:4], "big") & 0x7FFF_FFFF
            code = int.from_bytes(payload[4:8], "big")
            self.closed = f"GOAWAY {_H2_ERRORS.get(code, code)}"
            for sid in [s for s in self._streams if s > last]:
                self._end(sid, self.closed)

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        self._received += len(payload)
        if self._received > _OUR_WINDOW // 2:  # give the server its window back, rarely
            self._write(_window_update(0, self._received))
            self._received = 0
        if flags & _PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        got = stream.received
        got += payload
        at = 0
        while len(got) - at >= 5:
            size = int.from_bytes(got[at + 1 : at + 5], "big")
            if len(got) - at - 5 < size:
                break
            if not stream.ended:
                stream.on_message(bytes(got[at + 5 : at + 5 + size]))
            at += 5 + size
        del got[:at]
        if flags & _END_STREAM:
            self._end(stream_id, "the server ended the call (DATA)")

    def _on_settings(self, payload: bytes) -> None:
        for at in range(0, len(payload) - 5, 6):
            key, value = struct.unpack_from(">HI", payload, at)
            if key == _INITIAL_WINDOW_SIZE:
                for stream in self._streams.values():
                    stream.window += value - self.peer_initial_window
                self.peer_initial_window = value
            elif key == _MAX_FRAME_SIZE:
                self.peer_max_frame = value
            elif key == _MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
        self._write(_frame(_SETTINGS, _ACK, 0, b""))
        if not self.settled.done():
            self.settled.set_result(None)
        self._drain()

    def _end(self, stream_id: int, reason: str) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is not None and not stream.ended:
            stream.ended = True
            stream.on_end(reason)

    def _end_all(self, reason: str) -> None:
        self.closed = self.closed or reason
        if not self.settled.done():
            self.settled.set_exception(ConnectionError(reason))
        for sid in list(self._streams):
            self._end(sid, reason)

    # --- frames out ------------------------------------------------------------------------

    def send_data(self, stream: H2Stream, data: bytes) -> None:
        self._pending.append((stream, memoryview(data)))
        if len(self._pending) == 1:
            self._drain()

    def reset(self, stream: H2Stream) -> None:
        self._streams.pop(stream.id, None)
        self._write(_frame(_RST_STREAM, 0, stream.id, _HEADER.pack(0x8)))  # CANCEL

    def _drain(self) -> None:
        """Send queued DATA in order while the windows allow (head-of-line by design: the
        server reads every stream, so a full stream window opens again soon)."""
        pending = self._pending
        while pending:
            stream, data = pending[0]
            if stream.ended:
                pending.popleft()
                continue
            n = min(len(data), self.send_window, stream.window, self.peer_max_frame)
            if n <= 0:
                return
            self.send_window -= n
            stream.window -= n
            self._write(_frame(_DATA, 0, stream.id, bytes(data[:n])))
            if n == len(data):
                pending.popleft()
            else:
                pending[0] = (stream, data[n:])

    def _write(self, frame: bytes) -> None:
        self._out.append(frame)
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """One socket write per loop turn, however many frames were queued in it."""
        self._flush_pending = False
        if self._out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(self._out))
        self._out.clear()


def _window_update(stream_id: int, increment: int) -> bytes:
    return _frame(_WINDOW_UPDATE, 0, stream_id, _HEADER.pack(increment))


_H2_ERRORS = {
    0x0: "NO_ERROR",
    0x1: "PROTOCOL_ERROR",
    0x2: "INTERNAL_ERROR",
    0x3: "FLOW_CONTROL_ERROR",
    0x7: "REFUSED_STREAM",
    0x8: "CANCEL",
    0xB: "ENHANCE_YOUR_CALM",
}
