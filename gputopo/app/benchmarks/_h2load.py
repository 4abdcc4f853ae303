"""Bidirectional gRPC streams over HTTP/2 through h2: the load side of `bench ingest`.

Why not grpc.aio: a grpc.aio client spends about 0.3 ms of CPU per message sent and
acknowledged (a batch per read, a batch per write, a completion-queue hop and a future each),
so generating 20,000 nodes' 4,000 reports/s took more than the aggregator it measures, on
the same two cores. Why h2 (python-hyper) and not frames written by hand: h2 is the
maintained HTTP/2 state machine of Python (framing by hyperframe, HPACK by hpack), so the
protocol's rules (stream states, both sides' flow-control windows, SETTINGS, PING, GOAWAY,
header compression) are kept by people who test them against other implementations; this
module is only the asyncio transport around `h2.connection.H2Connection`.

What it costs per message: a send is one `H2Connection.send_data` call (one DATA frame
serialized into h2's buffer; header validation and normalization are off, as the only
headers sent are the fixed gRPC request headers below); h2's buffer goes to the socket once
per loop turn, however many messages were queued in it. A response is one `DataReceived`
event: its bytes are acknowledged to h2 (which sends WINDOW_UPDATE only when half a window is
used, so the server's window never closes) and cut into gRPC messages (5-byte length prefix,
reassembled across frames).

What it does with the protocol:

1. the client preface and SETTINGS (no push; a 2 GiB - 1 receive window per stream and for the
   connection, so the server never waits for us);
2. streams opened with the gRPC request headers, at most the server's
   SETTINGS_MAX_CONCURRENT_STREAMS on a connection;
3. the server's flow control honoured: DATA waits, in order per connection, for the send
   window h2 tracks (`local_flow_control_window`) and is split at the server's frame size;
   it goes on when h2 reports `WindowUpdated` or new SETTINGS;
4. the end of a stream reported once, with its reason: trailers (or a trailers-only response)
   with `grpc-status` and `grpc-message`, RST_STREAM with its error code, GOAWAY, a protocol
   error or a lost connection.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterable

import grpc
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.errors import ErrorCodes

__all__ = ["H2Connection", "H2Stream", "grpc_headers", "status_reason"]

_OUR_WINDOW = 2**31 - 1  # the largest window HTTP/2 allows
_DEFAULT_WINDOW = 65_535

Headers = list[tuple[bytes, bytes]]

# gRPC status names by number, for a stream's end reason: grpc's enum (only its names are
# used here; no gRPC client library carries the load).
_STATUS_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


def grpc_headers(authority: str, path: str) -> Headers:
    """The request headers of a gRPC call (gRPC over HTTP/2, PROTOCOL-HTTP2.md), as h2 takes
    them: bytes, lower-case names, pseudo-headers first."""
    return [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", path.encode()),
        (b":authority", authority.encode()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ]


def status_reason(headers: Iterable[tuple[bytes, bytes]]) -> tuple[str, str]:
    """The name of trailers' `grpc-status`, and the end of the call in words with
    `grpc-message` (percent-encoded on the wire). Headers as h2 gives them with
    `header_encoding=None`: bytes."""
    status = message = None
    for name, value in headers:
        if name == b"grpc-status":
            status = value.decode(errors="replace")
        elif name == b"grpc-message":
            message = urllib.parse.unquote(value.decode(errors="replace"))
    if status is None:
        return "", "the server ended the call without grpc-status"
    named = _STATUS_NAMES.get(int(status), status) if status.isdecimal() else status
    return named, f"the server ended the call: {named}" + (f" ({message})" if message else "")


def _error_name(code: int) -> str:
    try:
        return ErrorCodes(code).name
    except ValueError:
        return str(code)


class H2Stream:
    """One call. `on_message(bytes)` gets each response message, `on_end(reason)` its end;
    `status` is then the name of the gRPC status the server sent ("" if none), to count
    ends by (the reason may name the node)."""

    __slots__ = ("_conn", "ended", "id", "on_end", "on_message", "received", "status", "trailers")

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
        self.received = bytearray()
        self.status = ""
        self.trailers: str | None = None  # the end reason the server's trailers give
        self.ended = False

    def send(self, message: bytes) -> None:
        """Queue one gRPC message (uncompressed) for this stream."""
        if not self.ended:
            self._conn.send_data(self, b"\x00" + len(message).to_bytes(4, "big") + message)

    def cancel(self) -> None:
        """RST_STREAM(CANCEL): the client ends the call; `on_end` is not called."""
        if not self.ended:
            self.ended = True
            self._conn.reset(self)


class H2Connection(asyncio.Protocol):
    """One HTTP/2 connection carrying many gRPC streams. Use `await H2Connection.open(...)`."""

    def __init__(self, headers: Headers) -> None:
        config = h2.config.H2Configuration(
            client_side=True,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
            validate_inbound_headers=False,
            normalize_inbound_headers=False,
        )
        self._h2 = h2.connection.H2Connection(config)
        self._headers = headers
        self._transport: asyncio.Transport | None = None
        self._flush_pending = False
        self._pending: deque[tuple[H2Stream, bytes]] = deque()
        self._streams: dict[int, H2Stream] = {}
        self.peer_max_streams = 2**31
        self.closed: str | None = None
        self.settled = asyncio.get_running_loop().create_future()

    @classmethod
    async def open(cls, host: str, port: int, headers: Headers) -> H2Connection:
        """Connect and wait for the server's SETTINGS (so its limits are known)."""
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: cls(headers), host, port)
        await asyncio.wait_for(asyncio.shield(conn.settled), 30)
        return conn

    @property
    def capacity(self) -> int:
        """How many more streams this connection may open (counted here: h2's own count
        walks every stream)."""
        if self.closed is not None:
            return 0
        return self.peer_max_streams - len(self._streams)

    def open_stream(
        self, on_message: Callable[[bytes], None], on_end: Callable[[str], None]
    ) -> H2Stream:
        """Start a call (HEADERS without END_STREAM); messages follow with `send`."""
        if self.closed is not None:
            raise ConnectionError(f"connection closed: {self.closed}")
        stream_id = self._h2.get_next_available_stream_id()
        self._h2.send_headers(stream_id, self._headers)
        stream = H2Stream(self, stream_id, on_message, on_end)
        self._streams[stream_id] = stream
        self._flush_soon()
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
        codes = h2.settings.SettingCodes
        self._h2.local_settings = h2.settings.Settings(
            client=True,
            initial_values={codes.ENABLE_PUSH: 0, codes.INITIAL_WINDOW_SIZE: _OUR_WINDOW},
        )
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(_OUR_WINDOW - _DEFAULT_WINDOW)
        self._flush_soon()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_all(f"connection lost: {exc or 'closed by the server'}")

    def data_received(self, data: bytes) -> None:
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as e:
            if self._h2.state_machine.state is h2.connection.ConnectionState.CLOSED:
                # h2 closes the connection at the first GOAWAY and refuses what follows it; a
                # gRPC server going away sends GOAWAY, PING, GOAWAY in one write, so this is
                # the server leaving (the batch's events, GOAWAY's code among them, are lost).
                self._end_all(f"GOAWAY (then {type(e).__name__}: {e})")
            else:
                self._end_all(f"HTTP/2 protocol error: {type(e).__name__}: {e}")
            self._flush()
            if self._transport is not None:
                self._transport.close()
            return
        streams = self._streams
        for event in events:
            kind = type(event)
            if kind is h2.events.WindowUpdated:  # the most frequent: gRPC Core's, per message
                if self._pending:
                    self._drain()
            elif kind is h2.events.DataReceived:
                assert isinstance(event, h2.events.DataReceived)  # for mypy; the `is` is cheap
                self._on_data(event, streams.get(event.stream_id))
            elif kind is h2.events.TrailersReceived or kind is h2.events.ResponseReceived:
                assert isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived)
                # A trailers-only response (an error before any message) is response headers
                # with END_STREAM: its status is in them.
                stream = streams.get(event.stream_id or 0)
                if event.stream_ended is not None and event.headers and stream is not None:
                    stream.status, stream.trailers = status_reason(event.headers)
            elif kind is h2.events.StreamEnded:
                assert isinstance(event, h2.events.StreamEnded)
                stream = streams.get(event.stream_id or 0)
                reason = stream.trailers if stream is not None else None
                self._end(
                    event.stream_id or 0, reason or "the server ended the call without trailers"
                )
            elif kind is h2.events.StreamReset:
                assert isinstance(event, h2.events.StreamReset)
                self._end(event.stream_id or 0, f"RST_STREAM {_error_name(event.error_code or 0)}")
            elif kind is h2.events.RemoteSettingsChanged:
                self._on_settings()
            elif kind is h2.events.ConnectionTerminated:
                assert isinstance(event, h2.events.ConnectionTerminated)
                # h2 takes nothing more on a connection after GOAWAY, so every stream ends.
                self._end_all(f"GOAWAY {_error_name(event.error_code or 0)}")
        if not self._flush_pending:  # what h2 answered (SETTINGS and PING acks, WINDOW_UPDATE)
            self._flush()

    # --- events ----------------------------------------------------------------------------

    def _on_data(self, event: h2.events.DataReceived, stream: H2Stream | None) -> None:
        stream_id = event.stream_id or 0
        if event.flow_controlled_length:
            self._h2.acknowledge_received_data(event.flow_controlled_length, stream_id)
        if stream is None or event.data is None:
            return
        got = stream.received
        got += event.data
        at = 0
        while len(got) - at >= 5:
            size = int.from_bytes(got[at + 1 : at + 5], "big")
            if len(got) - at - 5 < size:
                break
            if not stream.ended:
                stream.on_message(bytes(got[at + 5 : at + 5 + size]))
            at += 5 + size
        del got[:at]

    def _on_settings(self) -> None:
        self.peer_max_streams = self._h2.remote_settings.max_concurrent_streams
        if not self.settled.done():
            self.settled.set_result(None)
        self._drain()  # a larger initial window opens every stream's

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
        """Send `data` on `stream` now if the windows allow, else after what waits before it."""
        if self.closed is not None:
            return  # the stream has ended (or is about to, with the connection's reason)
        if self._pending:
            self._pending.append((stream, data))
            return
        try:  # h2 checks both windows and the frame size before it changes any state
            self._h2.send_data(stream.id, data)
        except (h2.exceptions.FlowControlError, h2.exceptions.FrameTooLargeError):
            self._pending.append((stream, data))
            self._drain()
        else:
            self._flush_soon()

    def reset(self, stream: H2Stream) -> None:
        self._streams.pop(stream.id, None)
        try:
            self._h2.reset_stream(stream.id, ErrorCodes.CANCEL)
        except h2.exceptions.StreamClosedError:
            return  # it ended on the server's side in the meantime
        self._flush_soon()

    def _drain(self) -> None:
        """Send queued DATA in order while the windows allow (head-of-line by design: the
        server reads every stream, so a full stream window opens again soon)."""
        pending = self._pending
        conn = self._h2
        if self.closed is not None:
            pending.clear()
            return
        while pending:
            stream, data = pending[0]
            if stream.ended or stream.id not in self._streams:
                pending.popleft()
                continue
            window = conn.local_flow_control_window(stream.id)
            n = min(len(data), window, conn.max_outbound_frame_size)
            if n <= 0:
                return
            conn.send_data(stream.id, data[:n] if n < len(data) else data)
            if n == len(data):
                pending.popleft()
            else:
                pending[0] = (stream, data[n:])
        self._flush_soon()

    def _flush_soon(self) -> None:
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """One socket write per loop turn, however many frames h2 queued in it."""
        self._flush_pending = False
        out = self._h2.data_to_send()
        if out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(out)
