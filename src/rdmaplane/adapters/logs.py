"""One log format for every long-running rdmaplane command (agent, device plugin, extender).

`--log-format text` (for people): `2026-01-02 10:00:00,123 INFO rdmaplane.services.agent: message
key=value`; `--log-format json` (for log collectors): one object per line with `ts`, `level`,
`logger`, `msg` and every field passed with `extra={...}`. Libraries log through the same
handler (uvicorn's server and access lines included), but only rdmaplane's own loggers follow
the level asked for: `-v` turns on rdmaplane's DEBUG lines, never gRPC's, httpx's or asyncio's
internals, which stay at WARNING.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import Literal, TextIO

Format = Literal["text", "json"]
FORMATS: tuple[str, ...] = ("text", "json")
# Loggers that follow the level asked for; uvicorn's say where it listens (INFO) and, when on,
# log each request (its access logger, INFO). Handlers uvicorn's own logging config may have
# put on them are removed, so their lines take the one format too.
OWN = ("rdmaplane",)
LIBRARY_INFO = ("uvicorn", "uvicorn.error", "uvicorn.access")

# Attributes every LogRecord has; anything else came in through `extra`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def _extra(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(_extra(record))
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """The classic line, with the `extra` fields appended as key=value."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = " ".join(f"{k}={v}" for k, v in _extra(record).items())
        if not fields:
            return line
        first, newline, rest = line.partition("\n")  # keep a traceback below the fields
        return f"{first} {fields}{newline}{rest}"


def configure(fmt: str = "text", level: str = "INFO", stream: TextIO | None = None) -> None:
    """Root logging to `stream` (the current sys.stderr when None, looked up now: a default
    bound at import would outlive a replaced stderr); rdmaplane's loggers at `level`."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    for name in OWN:
        logging.getLogger(name).setLevel(level)
    for name in LIBRARY_INFO:
        library = logging.getLogger(name)
        library.handlers.clear()
        library.propagate = True
        library.setLevel(logging.INFO)
