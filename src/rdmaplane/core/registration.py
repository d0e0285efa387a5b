"""Staying served and registered with the kubelet: one pure state machine for every socket.

A kubelet-facing socket (the device plugin's, the DRA driver's two) must be served again
whenever it vanished, and the device plugin must call `Registration.Register` exactly once per
kubelet start: the v1.37.2 kubelet refuses a second Register from a connected socket ("device
plugin already connected") and, refusing it, is stuck until it restarts (field notes). The
adapter (`rdmaplane.adapters.kubelet.registration`) does the I/O; this module decides.

Decisions are taken on what *is*, never on which event arrived: the adapter arms its inotify
watch first, then looks (`Look`: is our socket there and ours, which `kubelet.sock` is there,
what time it is) and asks `decide`. An event only wakes it to look again, so an event that
arrives between a look and the wait, or is read with another, or is lost, changes nothing. The
rules, one per fact:

* our socket is not ours (gone, or never served) ⇒ serve it. In `kubelet` mode a socket that
  vanished is a kubelet start (a starting kubelet wipes `device-plugins/`): register again.
* `kubelet.sock` absent, or another file than the one registered with, after a registration ⇒
  that kubelet is gone: register again (with the next one; while none is there, wait).
* register only with a `kubelet.sock` seen in the same look as our socket, and remember the one
  seen then. (A kubelet that starts between that look and the call has wiped our socket before
  it listens, so it cannot dial us back: the call fails, nothing is connected, and the next
  look sees our socket gone and registers with it.) A refusal as "already connected" is final
  for that kubelet: not retried.
* a failed serve or Register is retried after a backoff (doubling, up to `max_backoff_s`),
  at once when something changes in the folder.
* each outage (from the moment a kubelet is seen gone until we are registered again) logs its
  "waiting" line once: the flag is cleared when an outage begins and when it ends.

The state is data (`State`, frozen) owned by the adapter's object, not by a task: a supervised
task that is restarted goes on from where it was and cannot register twice.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Final, Literal

Identity = tuple[int, int]  # (st_dev, st_ino) of a socket file
Level = Literal["info", "warning", "error"]

KUBELET: Final = "kubelet"  # the plugin calls Register on device-plugins/kubelet.sock
WATCHER: Final = "watcher"  # the kubelet's plugin watcher finds the socket itself
Mode = Literal["kubelet", "watcher"]


class Act(Enum):
    SERVE = "serve"
    REGISTER = "register"
    WAIT = "wait"


class RegisterOutcome(Enum):
    REGISTERED = "registered"
    ALREADY_CONNECTED = "already-connected"  # final for this kubelet: never retried
    FAILED = "failed"  # retried after a backoff


@dataclass(frozen=True, slots=True)
class Look:
    """What the adapter saw, after arming its watch."""

    ours: bool  # our socket is in place and is the one we serve
    kubelet: Identity | None = None  # kubelet.sock (kubelet mode); None when absent
    now: float = 0.0  # the adapter's monotonic clock


@dataclass(frozen=True, slots=True)
class Line:
    """A log line the adapter writes, with `{socket}` and `{kubelet}` standing for the paths."""

    level: Level
    text: str


@dataclass(frozen=True, slots=True)
class Step:
    """What to do now: serve, register with `kubelet`, or wait up to `wait_s` (None: until
    something changes) and look again. `lines` are logged first."""

    act: Act
    kubelet: Identity | None = None
    wait_s: float | None = None
    lines: tuple[Line, ...] = ()


@dataclass(frozen=True, slots=True)
class State:
    mode: Mode = KUBELET
    served: bool = False  # we served, and have not seen the socket gone since
    registered_with: Identity | None = None  # the kubelet.sock our last Register went to
    wanted: bool = True  # a Register is owed to the kubelet (kubelet mode)
    serve_failures: int = 0
    register_failures: int = 0
    retry_at: float | None = None  # no serve / Register before this time
    outage_logged: bool = False
    registrations: int = 0


_VANISHED = "socket {socket} vanished (kubelet restarted?); serving again"
_RETRYING = "retrying until it answers"
PATIENCE: Final = 3  # failed Registers in a row before a warning: a kubelet still starting


def initial(mode: Mode) -> State:
    return State(mode=mode, wanted=mode == KUBELET)


def backoff(failures: int, first_s: float, max_s: float) -> float:
    """The delay after `failures` failures in a row: first_s, doubling, at most max_s."""
    if failures <= 0:
        return 0.0
    return float(min(first_s * 2 ** (failures - 1), max_s))


def _waiting(s: State, look: Look) -> float | None:
    """How long until a retry may happen (None: now)."""
    if s.retry_at is None or look.now >= s.retry_at:
        return None
    return s.retry_at - look.now


def decide(s: State, look: Look, recheck_s: float) -> tuple[State, Step]:
    """The next step for what `look` shows (see the module docstring)."""
    lines: list[Line] = []
    if not look.ours:
        if s.served:
            lines.append(
                Line("warning", "socket {socket} vanished (kubelet restarted?); serving again")
            )
            s = replace(s, served=False, retry_at=None, serve_failures=0)
            if s.mode == KUBELET:
                s = _kubelet_gone(s)
        wait = _waiting(s, look)
        if wait is not None:
            return s, Step(Act.WAIT, wait_s=wait, lines=tuple(lines))
        return s, Step(Act.SERVE, lines=tuple(lines))
    if s.mode == WATCHER:
        return s, Step(Act.WAIT, wait_s=recheck_s, lines=tuple(lines))
    if s.registered_with is not None and look.kubelet != s.registered_with:
        s = _kubelet_gone(s)  # kubelet.sock gone or replaced: that kubelet stopped
    if not s.wanted:
        return s, Step(Act.WAIT, wait_s=recheck_s, lines=tuple(lines))
    if look.kubelet is None:
        s, line = _log_once(s, "warning", "waiting for {kubelet}")
        lines += line
        return s, Step(Act.WAIT, wait_s=recheck_s, lines=tuple(lines))
    wait = _waiting(s, look)
    if wait is not None:
        return s, Step(Act.WAIT, wait_s=wait, lines=tuple(lines))
    return s, Step(Act.REGISTER, kubelet=look.kubelet, lines=tuple(lines))


def _kubelet_gone(s: State) -> State:
    """A kubelet stopped (or a new one started): a Register is owed; a new outage begins."""
    return replace(
        s,
        registered_with=None,
        wanted=True,
        register_failures=0,
        retry_at=None,
        outage_logged=False,
    )


def _log_once(s: State, level: Level, text: str) -> tuple[State, list[Line]]:
    if s.outage_logged:
        return s, []
    return replace(s, outage_logged=True), [Line(level, text)]


def served(
    s: State, ok: bool, why: str, now: float, first_s: float, max_s: float
) -> tuple[State, tuple[Line, ...]]:
    """After a serve: ours now, or retried after a backoff."""
    if ok:
        return replace(s, served=True, serve_failures=0, retry_at=None), (
            Line("info", "serving on {socket}"),
        )
    failures = s.serve_failures + 1
    delay = backoff(failures, first_s, max_s)
    s = replace(s, serve_failures=failures, retry_at=now + delay)
    return s, (Line("warning", f"{why}; retrying in {delay:g} s"),)


def registered(
    s: State,
    kubelet: Identity,
    outcome: RegisterOutcome,
    why: str,
    now: float,
    first_s: float,
    max_s: float,
) -> tuple[State, tuple[Line, ...]]:
    """After a Register sent to the `kubelet.sock` that was `kubelet`."""
    if outcome is RegisterOutcome.FAILED:
        failures = s.register_failures + 1
        s = replace(s, register_failures=failures, retry_at=now + backoff(failures, first_s, max_s))
        if failures < PATIENCE:  # a starting kubelet makes its socket before it answers on it
            return s, (Line("info", f"{{kubelet}} does not answer yet ({why}); trying again"),)
        s, lines = _log_once(
            s, "warning", f"cannot register at {{kubelet}} ({why}); retrying until it answers"
        )
        return s, tuple(lines)
    done = replace(
        s,
        registered_with=kubelet,
        wanted=False,
        register_failures=0,
        retry_at=None,
        outage_logged=False,  # the outage is over
    )
    if outcome is RegisterOutcome.REGISTERED:
        return replace(done, registrations=s.registrations + 1), (
            Line("info", "registered with the kubelet"),
        )
    return done, (
        Line(
            "error",
            f"the kubelet refused a second Register from {{socket}} ({why}); it refuses every"
            " later one too,"
            " until it restarts: not retrying",
        ),
    )
