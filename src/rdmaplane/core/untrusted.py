"""What every reader of input from elsewhere shares (files a user hands us, support archives
from another machine, objects from a cluster): the error that names the source and what is
wrong with it, and text made safe for a terminal. Pure: the file reading is `documents`'."""

from __future__ import annotations

from rdmaplane.core.errors import InputError


class DocumentError(InputError):
    """A document that cannot be used; the message names the source and the problem."""


class SettingsError(InputError):
    """Settings that cannot be used together; the message says which and why."""


class FieldError(SettingsError):
    """A setting whose value cannot be used: `field` names it as the code does (`ib_tc`, or
    a path into a section: `dra.enabled`), `reason` says why. Each front end names the field
    its own way: the CLI by the flag the user typed (`--ib-tc`), a config file by its key
    (`trafficClass`)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


# How an error names a document's types: the words of JSON and YAML, not Python's.
_TYPE_WORDS: dict[type, str] = {
    dict: "an object",
    list: "a list",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def type_word(kind: type) -> str:
    """`a list`, `a string`, `an object`…: a document's type as an error names it (another
    type by its Python name)."""
    return _TYPE_WORDS.get(kind, kind.__name__)


def what_it_is(value: object) -> str:
    """The type of a value read from a document, as an error names it (`got a list`)."""
    return type_word(type(value))


def printable(text: str) -> str:
    """`text` with every character a terminal would act on (escape sequences, carriage returns,
    bidi overrides, line breaks) written as its Python escape (`\\x1b`): strings from untrusted
    input (a support archive, a file from someone else) must reach a terminal as plain text."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)
