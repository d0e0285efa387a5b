"""Debian's archive over HTTP: signed suite indexes for the lock, hashed packages for the build.

Nothing fetched is trusted by where it came from: an `InRelease` must carry a signature that
`gpgv` checks against Debian's archive keyring, a `Packages` index must hash to what that
signed file says, and a package to what the lock (made from those indexes) says. Packages are
cached by hash in `~/.cache/rdmaplane/image/debs`, so a warm build fetches nothing from Debian.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import re
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from image.debian import Locked, Package, stanzas

KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rdmaplane" / "image"
TIMEOUT_S = 60


class FetchError(RuntimeError):
    pass


@dataclass(frozen=True)
class Suite:
    archive: str  # base URL
    name: str  # bookworm, bookworm-updates, bookworm-security
    component: str = "main"
    architecture: str = "amd64"


def get(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            data: bytes = response.read()
            return data
    except urllib.error.HTTPError as err:
        raise FetchError(f"{url}: HTTP {err.code}") from None
    except (urllib.error.URLError, OSError) as err:
        raise FetchError(f"{url}: {getattr(err, 'reason', err)}") from None


def verified_release(suite: Suite, keyring: Path = KEYRING) -> str:
    """The suite's `InRelease`, its signature checked by gpgv; the signed text."""
    url = f"{suite.archive}/dists/{suite.name}/InRelease"
    if not keyring.is_file():
        raise FetchError(f"{keyring} missing: install debian-archive-keyring to check {url}")
    with tempfile.NamedTemporaryFile(suffix=".InRelease") as signed:
        signed.write(get(url))
        signed.flush()
        done = subprocess.run(
            ["gpgv", "--keyring", str(keyring), "--output", "-", signed.name],
            capture_output=True,
        )
    if done.returncode != 0:
        raise FetchError(f"{url}: bad signature: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode()


def release_date(release: str) -> str:
    return next(iter(stanzas(release))).get("Date", "?")


def suite_packages(suite: Suite, release: str) -> Iterator[Package]:
    """The suite's packages, from a `Packages.xz` whose hash the signed release names."""
    path = f"{suite.component}/binary-{suite.architecture}/Packages.xz"
    fields = next(iter(stanzas(release)))
    listed = re.search(
        rf"^\s*([0-9a-f]{{64}})\s+\d+\s+{re.escape(path)}$", fields.get("SHA256", ""), re.M
    )
    if listed is None:
        raise FetchError(f"{suite.archive} {suite.name}: the release lists no {path}")
    data = get(f"{suite.archive}/dists/{suite.name}/{path}")
    if hashlib.sha256(data).hexdigest() != listed[1]:
        raise FetchError(f"{suite.archive} {suite.name} {path}: hash differs from the release's")
    for stanza in stanzas(lzma.decompress(data).decode()):
        yield Package.from_stanza(stanza, suite.archive)


def package_file(p: Locked, cache: Path = CACHE) -> Path:
    """The .deb, from the cache or the archive, its hash checked against the lock."""
    path = cache / "debs" / f"{p.sha256}.deb"
    if path.is_file():
        return path
    try:
        data = get(p.url)
    except FetchError as err:
        raise FetchError(
            f"{err}: {p.name} {p.version} is not on the archive any more (Debian drops superseded "
            "versions): `make image-lock` takes the current ones"
        ) from None
    if hashlib.sha256(data).hexdigest() != p.sha256 or len(data) != p.size:
        raise FetchError(f"{p.url}: not what image/debian.lock says ({p.name} {p.version})")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".part")
    partial.write_bytes(data)
    partial.rename(path)
    return path
