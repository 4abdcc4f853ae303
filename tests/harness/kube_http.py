"""A minimal JSON-over-HTTPS session to the test API server, using only the standard library.

Why not the kubernetes client: the harness needs raw status codes and generic access to any
resource (discovery, sweeping whatever a test left behind), with no client-side validation or
model decoding in the way, and a readiness probe that works before the server is up. One
kept-alive connection makes the hundred-odd requests of a cleanup cheap.

Not thread-safe: give each thread its own session.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class JsonResponse:
    """Status code and body: parsed JSON when the server sent JSON, else the text."""

    status: int
    body: Any

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class JsonSession:
    """Requests to one server with one bearer token, over a connection reopened as needed."""

    def __init__(self, *, host: str, ca_path: Path, token: str) -> None:
        parts = urlsplit(host)
        if parts.scheme != "https" or parts.hostname is None:
            raise ValueError(f"expected an https:// URL, got {host!r}")
        self._hostname = parts.hostname
        self._port = parts.port or 443
        self._context = ssl.create_default_context(cafile=str(ca_path))
        self._token = token
        self._connection: http.client.HTTPSConnection | None = None

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> JsonResponse:
        """Send one request; a connection the server closed in between is retried once.
        `content_type` names the body's patch flavour for PATCH (JSON either way).

        Raises OSError (refused, reset, TLS failure) when the server cannot be reached.
        """
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        if payload is not None:
            headers["Content-Type"] = content_type
        for attempt in (1, 2):
            connection = self._connect()
            try:
                connection.request(method, path, body=payload, headers=headers)
                return _read(connection.getresponse())
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt == 2:
                    raise
            except (OSError, http.client.HTTPException):
                self.close()
                raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _connect(self) -> http.client.HTTPSConnection:
        if self._connection is None:
            self._connection = http.client.HTTPSConnection(
                self._hostname, self._port, timeout=_TIMEOUT_S, context=self._context
            )
        return self._connection


def _read(response: http.client.HTTPResponse) -> JsonResponse:
    raw = response.read()
    text = raw.decode("utf-8", errors="replace")
    if response.getheader("Content-Type", "").startswith("application/json"):
        return JsonResponse(status=response.status, body=json.loads(text))
    return JsonResponse(status=response.status, body=text)
