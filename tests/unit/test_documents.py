"""Hostile documents get one clear DocumentError naming the source, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.adapters.documents import (
    MAX_DEPTH,
    DocumentError,
    expect_mapping,
    printable,
    read_document,
    read_documents,
)

HOSTILE = {
    "deep-json": "[" * 100_000 + "]" * 100_000,
    "deep-yaml": "a:\n" + "".join("  " * i + "b:\n" for i in range(1, 3000)),
    "deep-flow-yaml": "{a: " * 5000 + "1" + "}" * 5000,
    "just-deep": "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
    "syntax": "a: [1, 2\nb: }",
    "nul": "a: 1\0",
    "tabs": "a:\n\tb: 1",
    "unhashable-key": "? [1, 2]\n: x",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_text_is_a_document_error(tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(HOSTILE[name])
    with pytest.raises(DocumentError) as e:
        read_document(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_binary_junk_names_the_offset(tmp_path: Path) -> None:
    path = tmp_path / "junk"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(DocumentError, match="not UTF-8 text"):
        read_document(path)


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_unreadable_paths(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "x"
    if kind == "directory":
        path.mkdir()
    with pytest.raises(DocumentError, match="directory" if kind == "directory" else "cannot read"):
        read_document(path)


def test_size_bound(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_text("[" + "1," * 1000 + "1]")
    with pytest.raises(DocumentError, match="larger than"):
        read_document(path, max_bytes=100)


def test_alias_bomb_is_cheap_and_fine(tmp_path: Path) -> None:
    """Aliases share one object: ten levels of ten-fold fan-out would be 10^10 if expanded."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join(['*a' + str(i - 1)] * 10)}]" for i in range(1, 10)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines))
    doc = expect_mapping(read_document(path), str(path))
    assert len(doc) == 10


def test_good_documents_parse(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"a": [1, {"b": null}]}')
    (tmp_path / "b.yaml").write_text("a:\n- 1\n- b: null\n")
    (tmp_path / "c.yaml").write_text("{a: 1}")  # flow YAML, not JSON
    (tmp_path / "empty.yaml").write_text("")
    assert read_document(tmp_path / "a.json") == read_document(tmp_path / "b.yaml")
    assert read_document(tmp_path / "c.yaml") == {"a": 1}
    assert expect_mapping(read_document(tmp_path / "empty.yaml"), "empty") == {}
    with pytest.raises(DocumentError, match="got a list"):
        expect_mapping([1], "x")


def test_a_stream_of_documents(tmp_path: Path) -> None:
    path = tmp_path / "objects.yaml"
    path.write_text("a: 1\n---\n---\n- b\n...\n---\nc: {d: 2}\n")
    assert read_documents(path) == [{"a": 1}, ["b"], {"c": {"d": 2}}]
    (tmp_path / "one.json").write_text('{"kind": "List", "items": []}')
    assert read_documents(tmp_path / "one.json") == [{"kind": "List", "items": []}]
    (tmp_path / "empty.yaml").write_text("")
    assert read_documents(tmp_path / "empty.yaml") == []


@pytest.mark.parametrize(
    ("second", "message"),
    [
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "nested deeper than"),
        ("a: [1, 2\nb: }", "not valid YAML/JSON: line 4"),
        ("a: 1\0", "NUL bytes"),
    ],
)
def test_a_bad_later_document_fails_the_file(tmp_path: Path, second: str, message: str) -> None:
    path = tmp_path / "objects.yaml"
    path.write_text(f"a: 1\n---\n{second}\n")
    with pytest.raises(DocumentError, match=message) as e:
        read_documents(path)
    assert str(e.value).startswith(f"{path}: ")


@given(st.text())
def test_printable_text_is_safe_and_printable_input_is_kept(text: str) -> None:
    shown = printable(text)
    assert shown.isprintable()
    assert (shown == text) == text.isprintable()
    assert printable("\x1b[31m red\r\n") == "\\x1b[31m red\\r\\n"


@pytest.mark.parametrize(
    ("value", "word"),
    [({}, "an object"), ([], "a list"), ("x", "a string"), (7, "a number"), (0.5, "a number"),
     (True, "a boolean"), (None, "null"), (b"x", "bytes")],
)  # fmt: skip
def test_errors_name_a_documents_types_in_its_own_words(value: object, word: str) -> None:
    """JSON's and YAML's words, the same wherever input is refused (a bool is no number)."""
    from rdmaplane.core.untrusted import what_it_is

    assert what_it_is(value) == word
