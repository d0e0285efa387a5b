"""The final stage of the Dockerfile, read as the image's description, pure.

`make image` builds the image the Dockerfile describes without running Docker: its build stage
runs the same recipe (`python3 -m image layers`), and this module reads the final stage, the
layers it copies and its settings (USER, ENV, WORKDIR, ENTRYPOINT, CMD, LABEL), so that the
Dockerfile stays the one place they are written. The final stage may hold only those
instructions; anything else is refused with its line, since the archive could not match it.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from image.oci import Config


class DockerfileError(ValueError):
    pass


@dataclass(frozen=True)
class Copy:
    source: str  # a folder of the build stage, e.g. /layers/debian/
    created_by: str  # the instruction, for the image's history


@dataclass
class FinalStage:
    base: str  # `scratch`: the layers are all there is
    copies: list[Copy] = field(default_factory=list)
    settings: Config = field(default_factory=lambda: Config(workdir="/"))


def instructions(text: str) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    found: list[tuple[int, str, str]] = []
    pending, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if not pending:
            start = n
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        word, _, rest = whole.partition(" ")
        found.append((start, word.upper(), rest.strip()))
    if pending:
        raise DockerfileError(f"Dockerfile:{start}: a continuation line at the end of the file")
    return found


def _pairs(n: int, word: str, args: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in shlex.split(args):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise DockerfileError(f"Dockerfile:{n}: {word} takes key=value pairs, got {item!r}")
        pairs[key] = value
    return pairs


def _exec_form(n: int, word: str, args: str) -> list[str]:
    try:
        value = json.loads(args)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DockerfileError(f"Dockerfile:{n}: {word} must be a JSON list of strings")
    return value


def final_stage(text: str, build_stage: str = "build") -> FinalStage:
    """The last stage, whose COPY instructions must all be `--from=<build_stage> DIR /`."""
    steps = instructions(text)
    starts = [i for i, (_, word, _) in enumerate(steps) if word == "FROM"]
    if not starts:
        raise DockerfileError("Dockerfile: no FROM")
    n, _, base = steps[starts[-1]]
    stage = FinalStage(base=base.split()[0])
    if stage.base != "scratch":
        raise DockerfileError(f"Dockerfile:{n}: the final stage must start FROM scratch")
    for n, word, args in steps[starts[-1] + 1 :]:
        if word == "COPY":
            parts = args.split()
            if len(parts) != 3 or parts[0] != f"--from={build_stage}" or parts[2] != "/":
                raise DockerfileError(f"Dockerfile:{n}: COPY must be `--from={build_stage} DIR /`")
            stage.copies.append(Copy(parts[1], f"COPY {args}"))
        elif word == "USER":
            stage.settings.user = args
        elif word == "ENV":
            stage.settings.env.update(_pairs(n, word, args))
        elif word == "LABEL":
            stage.settings.labels.update(_pairs(n, word, args))
        elif word == "WORKDIR":
            stage.settings.workdir = args
        elif word == "ENTRYPOINT":
            stage.settings.entrypoint = _exec_form(n, word, args)
        elif word == "CMD":
            stage.settings.cmd = _exec_form(n, word, args)
        else:
            raise DockerfileError(
                f"Dockerfile:{n}: {word} in the final stage: `make image` cannot build it"
            )
    if not stage.copies:
        raise DockerfileError("Dockerfile: the final stage copies no layers")
    return stage
