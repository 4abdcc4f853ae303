"""Which node an exporter may report, from its pod's projected ServiceAccount token.

A DaemonSet cannot mount a certificate per node from one Secret, but every pod can get a
ServiceAccount token bound to itself (a projected volume with an audience). The aggregator
checks it as the kubelet's NodeRestriction reasoning goes: the API server's TokenReview says
whether the token is valid for our audience, which account it belongs to and which pod it is
bound to (`authentication.kubernetes.io/pod-name`/`pod-uid` in `user.extra`); that pod's
`spec.nodeName` is the one node the stream may report. A token of another account, of a pod
that is gone or replaced, or meant for another audience proves nothing.

Answers are cached by a hash of the token for `ttl_s` (5 s), so a reconnecting fleet costs the
API server one review per exporter per `ttl_s`, not one per stream, while a deleted pod's token
stops proving its node within 5 s. The review happens when a stream opens; the stream a
deleted pod held ends with its exporter.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable

from gputopo.runtime.kube import KubeClient, KubeError, NotFoundError

__all__ = ["DEFAULT_AUDIENCE", "DEFAULT_TTL_S", "IdentityError", "TokenNodes"]

DEFAULT_AUDIENCE = "gputopo-aggregator"
# A deleted pod's token must stop proving a node quickly (it was 60 s, while the README said it
# was refused); 5 s still spares the API server a review per reconnect of a flapping stream.
DEFAULT_TTL_S = 5.0
_POD_NAME = "authentication.kubernetes.io/pod-name"
_POD_UID = "authentication.kubernetes.io/pod-uid"
_SA_PREFIX = "system:serviceaccount:"


class IdentityError(Exception):
    """The token proves no node; the message says why, in one line."""


class TokenNodes:
    """See the module docstring. `accounts` are `namespace:name` of the exporters'
    ServiceAccount(s); a token of any other account is refused."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        accounts: Iterable[str],
        audience: str = DEFAULT_AUDIENCE,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self.accounts = frozenset(accounts)
        self.audience = audience
        self._ttl = ttl_s
        self._clock = clock
        self._cache: dict[str, tuple[str, float]] = {}
        self.reviews = 0

    async def node_of(self, token: str) -> str:
        """The node the token's pod runs on; IdentityError when it proves none."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        hit = self._cache.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        node = await self._review(token)
        if len(self._cache) > 10_000:  # bounded: drop the expired, else everything
            self._cache = {k: v for k, v in self._cache.items() if v[1] > now}
            if len(self._cache) > 10_000:
                self._cache.clear()
        self._cache[key] = (node, now + self._ttl)
        return node

    async def _review(self, token: str) -> str:
        self.reviews += 1
        try:
            status = await self._kube.review_token(token, [self.audience])
        except KubeError as err:
            raise IdentityError(f"identity token: cannot be reviewed now ({err})") from None
        if not status.get("authenticated"):
            why = status.get("error") or "not valid"
            raise IdentityError(f"identity token: {why} (audience {self.audience})")
        user = status.get("user") or {}
        username = str(user.get("username", ""))
        account = username[len(_SA_PREFIX) :] if username.startswith(_SA_PREFIX) else ""
        if account not in self.accounts:
            raise IdentityError(
                f"identity token: {username!r} is not an exporter's ServiceAccount"
                f" ({', '.join(sorted(self.accounts)) or 'none configured'})"
            )
        extra = user.get("extra") or {}
        pod_name = next(iter(extra.get(_POD_NAME) or []), "")
        pod_uid = next(iter(extra.get(_POD_UID) or []), "")
        if not pod_name:
            raise IdentityError("identity token: not bound to a pod (use a projected token)")
        namespace = account.split(":", 1)[0]
        try:
            pod = await self._kube.get_pod(namespace, pod_name)
        except NotFoundError:
            raise IdentityError(f"identity token: pod {namespace}/{pod_name} is gone") from None
        except KubeError as err:
            raise IdentityError(f"identity token: cannot read its pod now ({err})") from None
        if pod_uid and (pod.get("metadata") or {}).get("uid") != pod_uid:
            raise IdentityError(f"identity token: pod {namespace}/{pod_name} was replaced")
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        if not node:
            raise IdentityError(f"identity token: pod {namespace}/{pod_name} runs on no node")
        return node
