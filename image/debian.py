"""Debian's package metadata, pure: versions, dependency fields, the package set the image needs.

The image installs Debian packages the way `apt-get install --no-install-recommends` would, but
without apt or dpkg: `resolve` closes a list of roots over `Pre-Depends` and `Depends` (never
`Recommends`), one version per package, the newest any of the suites offers, and the lock records
exactly that set. Versions compare by dpkg's own rules (tests hold `compare` to `dpkg
--compare-versions`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

# ------------------------------------------------------------------------------ versions


@dataclass(frozen=True, order=False)
class Version:
    epoch: int
    upstream: str
    revision: str

    @classmethod
    def parse(cls, text: str) -> Version:
        """`[epoch:]upstream[-revision]`; raises ValueError on what dpkg would refuse."""
        epoch, colon, rest = text.partition(":")
        if not colon:
            epoch, rest = "0", text
        if not epoch.isdigit():
            raise ValueError(f"version {text!r}: epoch {epoch!r} is not a number")
        upstream, hyphen, revision = rest.rpartition("-")
        if not hyphen:
            upstream, revision = rest, ""
        if not upstream or not upstream[0].isdigit():
            raise ValueError(f"version {text!r}: the upstream part must start with a digit")
        # a hyphen only where a revision follows, a colon only after an epoch (dpkg's rules)
        allowed = "[A-Za-z0-9.+~" + (":" if colon else "") + ("-" if hyphen else "") + "]*"
        if not re.fullmatch(allowed, upstream) or not re.fullmatch("[A-Za-z0-9.+~]*", revision):
            raise ValueError(f"version {text!r}: a character dpkg does not allow")
        if hyphen and not revision:
            raise ValueError(f"version {text!r}: an empty revision")
        return cls(int(epoch), upstream, revision)

    def __str__(self) -> str:
        epoch = f"{self.epoch}:" if self.epoch else ""
        return epoch + self.upstream + (f"-{self.revision}" if self.revision else "")


def _order(c: str) -> int:
    """dpkg's weight of one character of a non-digit run: `~` sorts before the end of a part,
    letters before everything else."""
    if c == "~":
        return -1
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _part_compare(a: str, b: str) -> int:
    """dpkg's verrevcmp: alternate non-digit runs (by `_order`) and digit runs (as numbers)."""
    i = j = 0
    while i < len(a) or j < len(b):
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            bc = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ac != bc:
                return ac - bc
            i += 1
            j += 1
        di = i
        while di < len(a) and a[di].isdigit():
            di += 1
        dj = j
        while dj < len(b) and b[dj].isdigit():
            dj += 1
        na, nb = int(a[i:di] or 0), int(b[j:dj] or 0)
        if na != nb:
            return -1 if na < nb else 1
        i, j = di, dj
    return 0


def compare(a: Version, b: Version) -> int:
    """Negative, zero or positive as `a` sorts before, with or after `b` (dpkg's order)."""
    if a.epoch != b.epoch:
        return -1 if a.epoch < b.epoch else 1
    return _part_compare(a.upstream, b.upstream) or _part_compare(a.revision, b.revision)


_RELATIONS = {
    "<<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
    "=": lambda c: c == 0,
    ">=": lambda c: c >= 0,
    ">>": lambda c: c > 0,
}


# ------------------------------------------------------------------------------ dependencies


@dataclass(frozen=True)
class Relation:
    """One alternative of a dependency: a name and an optional version constraint."""

    name: str
    op: str | None = None
    version: Version | None = None

    def admits(self, version: Version | None) -> bool:
        """Whether a package (or a provided name) at `version` satisfies this relation; an
        unversioned Provides satisfies only unversioned relations, as in dpkg."""
        if self.op is None or self.version is None:
            return True
        return version is not None and _RELATIONS[self.op](compare(version, self.version))

    def __str__(self) -> str:
        return self.name + (f" ({self.op} {self.version})" if self.op else "")


_RELATION = re.compile(
    r"^(?P<name>[a-z0-9][a-z0-9+.-]+)(?::[a-z0-9-]+)?"
    r"\s*(?:\(\s*(?P<op><<|<=|=|>=|>>|<|>)\s*(?P<version>[^\s)]+)\s*\))?"
    r"\s*(?:\[[^\]]*\])?\s*(?:<[^>]*>\s*)*$"
)
_LEGACY_OPS = {"<": "<=", ">": ">="}  # obsolete spellings dpkg still reads


def parse_relations(field: str) -> list[list[Relation]]:
    """A `Depends`-style field: comma-separated groups of `|`-separated alternatives (an
    architecture qualifier such as `:any` is dropped: the image has one architecture)."""
    groups: list[list[Relation]] = []
    for group in field.split(","):
        if not group.strip():
            continue
        alternatives = []
        for alternative in group.split("|"):
            m = _RELATION.match(alternative.strip())
            if m is None:
                raise ValueError(f"dependency {alternative.strip()!r}: not a package relation")
            op = m["op"]
            version = Version.parse(m["version"]) if m["version"] else None
            alternatives.append(Relation(m["name"], _LEGACY_OPS.get(op or "", op), version))
        groups.append(alternatives)
    return groups


# ------------------------------------------------------------------------------ indexes


def stanzas(text: str) -> Iterator[dict[str, str]]:
    """The paragraphs of a deb822 file (`Packages`, a `control` file): field → value, a
    continuation line joined to its field with a newline."""
    fields: dict[str, str] = {}
    last = None
    for line in text.splitlines():
        if not line.strip():
            if fields:
                yield fields
            fields, last = {}, None
        elif line[0] in " \t":
            if last is None:
                raise ValueError(f"continuation line {line!r} before any field")
            fields[last] += "\n" + line[1:]
        elif not line.startswith("#"):
            name, sep, value = line.partition(":")
            if not sep:
                raise ValueError(f"line {line!r}: no `Field: value`")
            last = name.strip()
            fields[last] = value.strip()
    if fields:
        yield fields


@dataclass(frozen=True)
class Package:
    """One binary package as an index lists it, and the archive it comes from."""

    name: str
    version: Version
    architecture: str
    filename: str  # the pool path below the archive's root
    sha256: str
    size: int
    archive: str  # the archive's base URL, e.g. http://deb.debian.org/debian-security
    depends: tuple[tuple[Relation, ...], ...] = ()
    provides: tuple[Relation, ...] = ()

    @classmethod
    def from_stanza(cls, fields: Mapping[str, str], archive: str) -> Package:
        try:
            depends = [
                tuple(g)
                for key in ("Pre-Depends", "Depends")
                for g in parse_relations(fields.get(key, ""))
            ]
            provides = [g[0] for g in parse_relations(fields.get("Provides", ""))]
            return cls(
                fields["Package"],
                Version.parse(fields["Version"]),
                fields["Architecture"],
                fields["Filename"],
                fields["SHA256"],
                int(fields["Size"]),
                archive,
                tuple(depends),
                tuple(provides),
            )
        except KeyError as err:
            raise ValueError(
                f"package {fields.get('Package', '?')}: no {err.args[0]} field"
            ) from None


def newest(packages: Iterable[Package]) -> dict[str, Package]:
    """One package per name: the newest version among the suites (as apt's default pin)."""
    chosen: dict[str, Package] = {}
    for p in packages:
        held = chosen.get(p.name)
        if held is None or compare(p.version, held.version) > 0:
            chosen[p.name] = p
    return chosen


class ResolveError(ValueError):
    pass


def resolve(
    roots: Iterable[str], index: Mapping[str, Package], left_out: Iterable[str] = ()
) -> list[Package]:
    """`roots` and everything they depend on, one package per name, sorted by name.

    A dependency group already met by a chosen package (or one it provides) adds nothing;
    otherwise its first alternative that the index can meet is chosen, as apt does. A relation
    on a name in `left_out` counts as met (what only maintainer scripts use, which the image
    never runs). Raises ResolveError naming the package and the relation nothing meets."""
    skipped = set(left_out)
    providers: dict[str, list[tuple[Package, Version | None]]] = {}
    for p in index.values():
        for provided in p.provides:
            providers.setdefault(provided.name, []).append((p, provided.version))
    chosen: dict[str, Package] = {}

    def candidates(rel: Relation) -> Iterator[Package]:
        real = index.get(rel.name)
        if real is not None and rel.admits(real.version):
            yield real
        for p, version in sorted(providers.get(rel.name, ()), key=lambda pv: pv[0].name):
            if rel.admits(version):
                yield p

    def met(rel: Relation) -> bool:
        return rel.name in skipped or any(c.name in chosen for c in candidates(rel))

    todo: list[tuple[str, Relation]] = [("the roots", Relation(r)) for r in roots]
    while todo:
        wanted_by, rel = todo.pop(0)
        if met(rel):
            continue
        pick = next(candidates(rel), None)
        if pick is None:
            raise ResolveError(f"{wanted_by} need {rel}, which no package in the suites meets")
        chosen[pick.name] = pick
        for group in pick.depends:
            if not any(met(alt) for alt in group):
                found = next((alt for alt in group if next(candidates(alt), None)), group[0])
                todo.append((pick.name, found))
    return sorted(chosen.values(), key=lambda p: p.name)


# ------------------------------------------------------------------------------ the lock

LOCK_HEADER = "# name version architecture sha256 size archive filename"


@dataclass(frozen=True)
class Locked:
    """One line of image/debian.lock: what to fetch and what it must hash to."""

    name: str
    version: str
    architecture: str
    sha256: str
    size: int
    archive: str
    filename: str

    @property
    def url(self) -> str:
        return f"{self.archive.rstrip('/')}/{self.filename}"


@dataclass(frozen=True)
class Lock:
    roots: tuple[str, ...]
    left_out: tuple[str, ...]
    suites: tuple[str, ...]  # `archive suite date` of each InRelease read, for the record
    packages: tuple[Locked, ...]


def render_lock(lock: Lock) -> str:
    lines = [
        "# The Debian packages of the image, resolved from image/packages.txt by",
        "# `make image-lock` (python3 -m image lock). Do not edit by hand.",
        "roots: " + " ".join(lock.roots),
        "left out: " + " ".join(lock.left_out),
        *(f"suite: {s}" for s in lock.suites),
        LOCK_HEADER,
    ]
    for p in lock.packages:
        lines.append(
            f"{p.name} {p.version} {p.architecture} {p.sha256} {p.size} {p.archive} {p.filename}"
        )
    return "\n".join(lines) + "\n"


def parse_lock(text: str, source: str = "image/debian.lock") -> Lock:
    roots: tuple[str, ...] = ()
    left_out: tuple[str, ...] = ()
    suites: list[str] = []
    packages: list[Locked] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("roots:"):
            roots = tuple(line.removeprefix("roots:").split())
        elif line.startswith("left out:"):
            left_out = tuple(line.removeprefix("left out:").split())
        elif line.startswith("suite:"):
            suites.append(line.removeprefix("suite:").strip())
        else:
            parts = line.split()
            if (
                len(parts) != 7
                or not parts[4].isdigit()
                or not re.fullmatch(r"[0-9a-f]{64}", parts[3])
            ):
                raise ValueError(f"{source}:{n}: expected `{LOCK_HEADER[2:]}`, got {line!r}")
            name, version, arch, sha256, size, archive, filename = parts
            packages.append(Locked(name, version, arch, sha256, int(size), archive, filename))
    if not roots or not packages:
        raise ValueError(f"{source}: no roots or no packages (regenerate it: make image-lock)")
    return Lock(roots, left_out, tuple(suites), tuple(packages))


def locked(p: Package) -> Locked:
    return Locked(p.name, str(p.version), p.architecture, p.sha256, p.size, p.archive, p.filename)


def read_roots(text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """image/packages.txt: (the packages wanted, the names left out: `-name`), one a line,
    `#` comments."""
    names = [name for line in text.splitlines() if (name := line.split("#", 1)[0].strip())]
    roots = tuple(n for n in names if not n.startswith("-"))
    return roots, tuple(n[1:] for n in names if n.startswith("-"))
