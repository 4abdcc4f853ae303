"""The Kubernetes API's errors, apart from the client that raises them.

Why a module of their own: `gputopo.runtime.kube` imports the `kubernetes` package (about
20 MiB of an exporter's memory), and code that only *catches* these errors (the exporter's
command and device plugin, which load the client only with `--device-plugin`) should not have
to load it, nor look the class up in `sys.modules`. `gputopo.runtime.kube` re-exports them.
"""

from __future__ import annotations

__all__ = ["ConflictError", "GoneError", "KubeError", "NotFoundError", "ThrottledError"]


class KubeError(Exception):
    """An API call failed; `status` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str, *, retry_after_s: float = 0.0) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s


class ConflictError(KubeError):
    """409: the object changed since it was read (or already exists)."""


class NotFoundError(KubeError):
    """404."""


class GoneError(KubeError):
    """410: a watch's resource version is too old; list again."""


class ThrottledError(KubeError):
    """429 (or 503 with Retry-After): wait `retry_after_s` and try again."""
