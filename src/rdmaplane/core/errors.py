"""The one root of the errors rdmaplane raises on purpose, and the split the exit codes follow.

An `InputError` is input that cannot be used: a file, a flag, a document from a cluster or
another machine (the CLI exits 2). Any other `RdmaplaneError` is work that could not be done
with good input (exit 1). Each specific error subclasses one of the two and is named for what
it is; its message is whole (it names the file, the key or the flag), so whoever catches it
says it as it is. `rdmaplane.cli` maps them to exit codes in one place.
"""

from __future__ import annotations


class RdmaplaneError(Exception):
    """An error rdmaplane raises on purpose, with a message meant for people."""


class InputError(RdmaplaneError, ValueError):
    """Input that cannot be used; the message names it and says what is wrong. A `ValueError`
    too, so validators (pydantic's) report it as the value's problem."""
