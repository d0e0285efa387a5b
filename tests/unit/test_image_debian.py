"""image/debian.py: versions judged by dpkg itself, dependency fields, the resolver, the lock."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from image import debian
from image.debian import Package, Relation, Version

DPKG = shutil.which("dpkg")

_upstream = st.from_regex(r"[0-9][0-9a-z.+~]{0,6}", fullmatch=True)
_revision = st.from_regex(r"[0-9a-z.+~]{1,5}", fullmatch=True)
versions = st.builds(
    lambda epoch, up, rev: f"{epoch}:{up}" * (epoch is not None) + up * (epoch is None)
    + (f"-{rev}" if rev else ""),
    st.one_of(st.none(), st.integers(0, 3)), _upstream, st.one_of(st.none(), _revision),
)  # fmt: skip


def dpkg_compare(a: str, b: str) -> int:
    assert DPKG is not None
    for op, sign in (("lt", -1), ("gt", 1)):
        if subprocess.run([DPKG, "--compare-versions", a, op, b]).returncode == 0:
            return sign
    return 0


@pytest.mark.skipif(DPKG is None, reason="dpkg judges the order; this is not a Debian machine")
@settings(max_examples=150, deadline=None)
@given(versions, versions)
def test_versions_sort_as_dpkg_sorts_them(a: str, b: str) -> None:
    ours = debian.compare(Version.parse(a), Version.parse(b))
    assert (ours > 0) - (ours < 0) == dpkg_compare(a, b), (a, b)


@pytest.mark.parametrize(
    ("a", "b", "sign"),
    [
        ("1.0~rc1", "1.0", -1),  # ~ before the end
        ("2.36-9+deb12u10", "2.36-9+deb12u9", 1),  # digits as numbers
        ("1:1.0", "2.0", 1),  # the epoch first
        ("1.0", "1.0-0", 0),  # no revision is revision 0
        ("3.0.22-1~deb12u2", "3.0.22-1", -1),
    ],
)
def test_known_orders(a: str, b: str, sign: int) -> None:
    result = debian.compare(Version.parse(a), Version.parse(b))
    assert (result > 0) - (result < 0) == sign


@given(versions)
def test_a_version_prints_as_it_was_written(text: str) -> None:
    assert str(Version.parse(text)) == (text[2:] if text.startswith("0:") else text)


@pytest.mark.parametrize("bad", ["", "a1.0", "1.0-", "x:1.0", "1.0_2", "1:"])
def test_versions_dpkg_would_refuse_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="version"):
        Version.parse(bad)


def test_relations_as_debian_writes_them() -> None:
    field = (
        "libc6 (>= 2.34), media-types | mime-support, python3:any (>= 3.6~), foo [amd64] <!nocheck>"
    )
    groups = debian.parse_relations(field)
    assert [[str(r) for r in g] for g in groups] == [
        ["libc6 (>= 2.34)"], ["media-types", "mime-support"], ["python3 (>= 3.6~)"], ["foo"],
    ]  # fmt: skip
    with pytest.raises(ValueError, match="not a package relation"):
        debian.parse_relations("libc6 (>= 2.34")


def test_an_unversioned_provides_meets_only_unversioned_relations() -> None:
    assert Relation("awk").admits(None)
    assert not Relation("awk", ">=", Version.parse("1")).admits(None)
    assert Relation("awk", ">=", Version.parse("1")).admits(Version.parse("1.0"))


def test_stanzas_join_continuation_lines() -> None:
    text = "Package: a\nDescription: one\n two\n\n\nPackage: b\n"
    assert list(debian.stanzas(text)) == [
        {"Package": "a", "Description": "one\ntwo"}, {"Package": "b"},
    ]  # fmt: skip
    with pytest.raises(ValueError, match="no `Field: value`"):
        list(debian.stanzas("Package a\n"))


def pkg(name: str, version: str = "1", depends: str = "", provides: str = "") -> Package:
    fields = {"Package": name, "Version": version, "Architecture": "amd64",
              "Filename": f"pool/{name}.deb", "SHA256": "0" * 64, "Size": "1",
              "Depends": depends, "Provides": provides}  # fmt: skip
    return Package.from_stanza(fields, "http://deb.example")


def test_resolve_follows_depends_takes_the_first_alternative_and_a_provider() -> None:
    index = debian.newest([
        pkg("app", depends="lib (>= 2), awk, gone | alt"), pkg("lib", "1"), pkg("lib", "2"),
        pkg("mawk", provides="awk"), pkg("alt", depends="app"),
    ])  # fmt: skip
    chosen = debian.resolve(["app"], index)
    assert [(p.name, str(p.version)) for p in chosen] == [
        ("alt", "1"), ("app", "1"), ("lib", "2"), ("mawk", "1"),
    ]  # fmt: skip


def test_resolve_leaves_out_what_it_is_told_and_names_what_nothing_meets() -> None:
    index = debian.newest([pkg("app", depends="dpkg, lib (>= 3)"), pkg("lib", "2")])
    with pytest.raises(debian.ResolveError, match=r"app need lib \(>= 3\)"):
        debian.resolve(["app"], index, left_out=["dpkg"])
    index = debian.newest([pkg("app", depends="dpkg")])
    assert [p.name for p in debian.resolve(["app"], index, left_out=["dpkg"])] == ["app"]


names = st.sampled_from(["aa", "bb", "cc", "dd", "ee", "ff"])  # Debian: 2 characters or more


@given(st.dictionaries(names, st.lists(st.lists(names, min_size=1, max_size=2), max_size=3)),
       st.lists(names, min_size=1, max_size=3))  # fmt: skip
def test_what_resolve_returns_is_closed_over_its_dependencies(
    graph: dict[str, list[list[str]]], roots: list[str]
) -> None:
    index = {
        n: pkg(n, depends=", ".join(" | ".join(g) for g in groups)) for n, groups in graph.items()
    }
    try:
        chosen = debian.resolve(roots, index)
    except debian.ResolveError:
        # only when some needed name is missing from the index
        assert set(roots) - set(index) or any(
            all(alt not in index for alt in g) for groups in graph.values() for g in groups
        )
        return
    got = {p.name for p in chosen}
    assert set(roots) <= got and len(got) == len(chosen)
    for p in chosen:
        for group in p.depends:
            assert any(alt.name in got for alt in group), (p.name, group)


@given(st.lists(st.builds(debian.Locked, names, st.just("1.2-3"), st.just("amd64"),
                          st.just("a" * 64), st.integers(0, 10**9), st.just("http://x/debian"),
                          st.just("pool/main/x.deb")), min_size=1))  # fmt: skip
def test_the_lock_reads_back_as_written(packages: list[debian.Locked]) -> None:
    lock = debian.Lock(
        ("python3",), ("dpkg",), ("http://x/debian bookworm today",), tuple(packages)
    )
    assert debian.parse_lock(debian.render_lock(lock)) == lock


def test_a_damaged_lock_names_its_line() -> None:
    with pytest.raises(ValueError, match=r"debian.lock:2: expected"):
        debian.parse_lock("roots: a\nlibc6 2.36 amd64 nothex 12 http://x pool/x.deb\n")


def test_packages_txt_roots_and_left_out() -> None:
    assert debian.read_roots("a  # why\n-dpkg # never\n\n# note\nb\n") == (("a", "b"), ("dpkg",))
