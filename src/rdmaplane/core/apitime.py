"""The API server's timestamps (metav1.Time: RFC 3339 in UTC, to the second), written and read
by one rule: conditions, Events, device taints, claim conditions, the fault notice and the
Node's fault history all carry them. Pure."""

from __future__ import annotations

import datetime as dt

FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def api_time(at: dt.datetime | float) -> str:
    """`at` (an aware datetime, or wall-clock seconds) as the API writes it."""
    when = (
        at.astimezone(dt.UTC)
        if isinstance(at, dt.datetime)
        else dt.datetime.fromtimestamp(at, dt.UTC)
    )
    return when.strftime(FORMAT)


def parse_api_time(text: str) -> float:
    """Wall-clock seconds of a timestamp `api_time` wrote; ValueError when it is none."""
    return dt.datetime.strptime(text, FORMAT).replace(tzinfo=dt.UTC).timestamp()
