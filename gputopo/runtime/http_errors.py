"""Client mistakes on HTTP become one 400 line, never a 500 with a traceback.

Handlers check the shapes they expect (an object where one is needed, the fields' types) and
name the field; what is left is decoding: bytes that are not UTF-8, JSON that is not JSON or
nests deeply enough that `json.loads` recurses past Python's limit (RecursionError, not
ValueError), numbers out of range. Those are the client's error: the middleware answers 400 with
`{"error": ..., "code": "INVALID_ARGUMENT"}` naming the route and the problem, and logs one
WARNING line without a traceback so a fuzzer or a broken client cannot flood the log. A
TypeError, KeyError or AttributeError stays a 500: it means a handler trusted a shape it did not
check, a server bug that a 400 would hide (the HTTP fuzz suite finds none).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

__all__ = ["client_errors"]

log = logging.getLogger(__name__)

# What a malformed body raises in code that trusted its shape; an HTTPException (404, 405, ...)
# is aiohttp's own answer and passes through untouched.
_CLIENT_ERRORS = (RecursionError, ValueError, UnicodeError, OverflowError)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _one_line(err: BaseException) -> str:
    if isinstance(err, RecursionError):
        return "nested too deeply"
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:200]}" if text else type(err).__name__


@web.middleware
async def client_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer 400 (one line, the route and the problem) when a handler trips on the body."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except _CLIENT_ERRORS as err:
        why = _one_line(err)
        log.warning("HTTP %s %s from %s: 400 %s", request.method, request.path, request.remote, why)
        return web.json_response(
            {"error": f"{request.path}: malformed request ({why})", "code": "INVALID_ARGUMENT"},
            status=400,
        )
