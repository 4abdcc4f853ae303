"""Undecodable gRPC requests are INVALID_ARGUMENT and one rate-limited WARNING, not a traceback.

gRPC decodes a request before the servicer sees it; when the bytes are not the message (a
hostile or broken client), grpcio logs the DecodeError with a full traceback on every call and
answers UNKNOWN, so a client in a loop floods the log and learns nothing. This interceptor
gives each method a deserializer that cannot raise: it hands the servicer a marker instead,
and the wrapped behaviour answers INVALID_ARGUMENT naming the message type. Streams are
covered too: a stream ends with INVALID_ARGUMENT at the first undecodable message, after
everything before it was handled.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

__all__ = ["UndecodableRequests"]

log = logging.getLogger(__name__)

_LOG_EVERY_S = 10.0


class _Undecodable:
    """What the safe deserializer returns in place of a message it could not decode."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _Limiter:
    """One WARNING per method per `_LOG_EVERY_S`, with how many were left unsaid."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def warn(self, method: str, peer: str, reason: str) -> None:
        now = time.monotonic()
        if now - self._last.get(method, -_LOG_EVERY_S) < _LOG_EVERY_S:
            self._quiet[method] = self._quiet.get(method, 0) + 1
            return
        quiet = self._quiet.pop(method, 0)
        self._last[method] = now
        more = f" ({quiet} more since the last such line)" if quiet else ""
        log.warning("%s from %s: undecodable request: %s%s", method, peer, reason, more)


class UndecodableRequests(grpc.aio.ServerInterceptor):
    """Answer INVALID_ARGUMENT to request bytes that are not the method's message."""

    def __init__(self) -> None:
        self._limiter = _Limiter()

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = str(handler_call_details.method)
        decode = handler.request_deserializer
        limiter = self._limiter

        def safe(data: bytes) -> Any:
            try:
                return decode(data)
            except DecodeError as err:
                return _Undecodable(" ".join(str(err).split())[:200])

        async def refuse(context: grpc.aio.ServicerContext[Any, Any], bad: _Undecodable) -> None:
            limiter.warn(method, context.peer(), bad.reason)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request: {bad.reason}")

        async def checked(
            requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            async for msg in requests:
                if isinstance(msg, _Undecodable):
                    await refuse(context, msg)
                yield msg

        out = handler.response_serializer
        if handler.unary_unary is not None:
            inner_uu: Any = handler.unary_unary  # async on an aio server; the stubs say sync

            async def uu(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                if isinstance(request, _Undecodable):
                    await refuse(context, request)
                result = inner_uu(request, context)
                return await result if inspect.isawaitable(result) else result

            return grpc.unary_unary_rpc_method_handler(uu, safe, out)
        if handler.unary_stream is not None:
            inner_us: Any = handler.unary_stream  # async on an aio server; the stubs say sync

            async def us(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                if isinstance(request, _Undecodable):
                    await refuse(context, request)
                async for item in _responses(inner_us(request, context)):
                    yield item

            return grpc.unary_stream_rpc_method_handler(us, safe, out)
        if handler.stream_stream is not None:
            inner_ss: Any = handler.stream_stream  # async on an aio server; the stubs say sync

            async def ss(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                async for item in _responses(inner_ss(checked(requests, context), context)):
                    yield item

            return grpc.stream_stream_rpc_method_handler(ss, safe, out)
        inner_su: Any = handler.stream_unary  # async on an aio server; the stubs say sync

        async def su(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            result = inner_su(checked(requests, context), context)
            return await result if inspect.isawaitable(result) else result

        return grpc.stream_unary_rpc_method_handler(su, safe, out)


async def _responses(result: Any) -> AsyncIterator[Any]:
    """A servicer's responses, whether it yields them or writes them and returns."""
    if inspect.isasyncgen(result):
        async for item in result:
            yield item
    elif inspect.isawaitable(result):
        await result
    else:
        for item in result:
            yield item
