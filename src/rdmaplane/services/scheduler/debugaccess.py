"""Who may read the extender's `/debug/*` routes.

They show every node's cached state and the names of the pods on it, and `/debug/explain`
scores any pod against every node: useful to an operator, too much for anything else on the
cluster network. They answer clients on loopback (`kubectl port-forward` arrives there, and
needs the `pods/portforward` right) and, with `--debug-remote`, anyone; everyone else gets 403.
Everything else (/filter, /prioritize, health, metrics) is passed through untouched.
"""

from __future__ import annotations

import ipaddress

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

PREFIX = "/debug/"
REFUSED = orjson.dumps(
    {
        "Error": "/debug/* answers only on loopback (kubectl port-forward); "
        "start the extender with --debug-remote to serve it to other clients"
    }
)


def is_loopback(client: tuple[str, int] | None) -> bool:
    """Whether the peer address is a loopback one (IPv4, IPv6, or IPv4 mapped into IPv6)."""
    if client is None:
        return False  # a unix socket or a test transport without a peer: not known as local
    try:
        address = ipaddress.ip_address(client[0])
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


class LoopbackDebug:
    """ASGI middleware: `/debug/*` for loopback clients only, unless `remote`."""

    def __init__(self, app: ASGIApp, *, remote: bool) -> None:
        self.app = app
        self.remote = remote

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            not self.remote
            and scope["type"] == "http"
            and scope["path"].startswith(PREFIX)
            and not is_loopback(scope.get("client"))
        ):
            headers = [(b"content-type", b"application/json"),
                       (b"content-length", str(len(REFUSED)).encode())]  # fmt: skip
            await send({"type": "http.response.start", "status": 403, "headers": headers})
            await send({"type": "http.response.body", "body": REFUSED})
            return
        await self.app(scope, receive, send)
