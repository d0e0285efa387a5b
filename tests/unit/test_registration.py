"""The registration state machine (`rdmaplane.core.registration`): every transition, and random
kubelet lives against a model of the v1.37.2 kubelet's Register rules."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.core import registration as m
from rdmaplane.core.registration import Act, Look, RegisterOutcome, State

RECHECK = 30.0
FIRST, MAX = 0.05, 5.0
K1, K2 = (1, 7), (1, 8)


def decide(s: State, ours: bool, kubelet: m.Identity | None = None, now: float = 0.0):
    return m.decide(s, Look(ours, kubelet, now), RECHECK)


def texts(lines: tuple[m.Line, ...]) -> list[str]:
    return [line.text for line in lines]


def registered_state(kubelet: m.Identity = K1) -> State:
    s, _ = m.served(m.initial(m.KUBELET), True, "", 0.0, FIRST, MAX)
    s, _ = m.registered(s, kubelet, RegisterOutcome.REGISTERED, "", 0.0, FIRST, MAX)
    return s


# ------------------------------------------------------------------ every transition


def test_a_socket_never_served_is_served_without_a_warning() -> None:
    _, step = decide(m.initial(m.KUBELET), ours=False)
    assert step.act is Act.SERVE and step.lines == ()


def test_serving_makes_the_socket_ours_and_says_where() -> None:
    s, lines = m.served(m.initial(m.KUBELET), True, "", 0.0, FIRST, MAX)
    assert s.served and texts(lines) == ["serving on {socket}"]


def test_a_failed_serve_is_retried_after_a_doubling_backoff() -> None:
    s = m.initial(m.KUBELET)
    s, lines = m.served(s, False, "cannot serve on x: EACCES", 10.0, FIRST, MAX)
    assert texts(lines) == ["cannot serve on x: EACCES; retrying in 0.05 s"]
    s, step = decide(s, ours=False, now=10.01)
    assert step.act is Act.WAIT and step.wait_s is not None and abs(step.wait_s - 0.04) < 1e-9
    s, step = decide(s, ours=False, now=10.05)
    assert step.act is Act.SERVE
    s, lines = m.served(s, False, "again", 10.05, FIRST, MAX)
    assert s.retry_at == 10.05 + 0.1


def test_backoff_doubles_up_to_its_limit() -> None:
    assert [m.backoff(n, FIRST, MAX) for n in range(9)] == [
        0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0,
    ]  # fmt: skip


def test_without_a_kubelet_sock_it_waits_and_says_so_once() -> None:
    s, _ = m.served(m.initial(m.KUBELET), True, "", 0.0, FIRST, MAX)
    s, step = decide(s, ours=True, kubelet=None)
    assert step.act is Act.WAIT and step.wait_s == RECHECK
    assert texts(step.lines) == ["waiting for {kubelet}"]
    s, step = decide(s, ours=True, kubelet=None)
    assert step.act is Act.WAIT and step.lines == ()


def test_with_a_kubelet_sock_it_registers_with_the_one_it_saw() -> None:
    s, _ = m.served(m.initial(m.KUBELET), True, "", 0.0, FIRST, MAX)
    _, step = decide(s, ours=True, kubelet=K1)
    assert step.act is Act.REGISTER and step.kubelet == K1


def test_a_registration_ends_the_outage() -> None:
    s, _ = m.served(m.initial(m.KUBELET), True, "", 0.0, FIRST, MAX)
    s, _ = decide(s, ours=True, kubelet=None)
    assert s.outage_logged
    s, lines = m.registered(s, K1, RegisterOutcome.REGISTERED, "", 1.0, FIRST, MAX)
    assert texts(lines) == ["registered with the kubelet"]
    assert s.registered_with == K1 and not s.wanted and not s.outage_logged
    assert s.registrations == 1


def test_registered_with_the_same_kubelet_it_only_waits() -> None:
    s, step = decide(registered_state(), ours=True, kubelet=K1)
    assert step.act is Act.WAIT and step.wait_s == RECHECK and step.lines == ()
    assert s == registered_state()


def test_a_failed_register_is_retried_after_a_backoff_and_said_once() -> None:
    s, _ = m.served(m.initial(m.KUBELET), True, "", 0.0, FIRST, MAX)
    s, lines = m.registered(s, K1, RegisterOutcome.FAILED, "UNAVAILABLE: x", 5.0, FIRST, MAX)
    assert texts(lines) == ["{kubelet} does not answer yet (UNAVAILABLE: x); trying again"]
    assert [line.level for line in lines] == ["info"]  # a kubelet still starting
    s, step = decide(s, ours=True, kubelet=K1, now=5.02)
    assert step.act is Act.WAIT and step.wait_s is not None and step.wait_s < 0.05
    s, step = decide(s, ours=True, kubelet=K1, now=5.05)
    assert step.act is Act.REGISTER
    s, lines = m.registered(s, K1, RegisterOutcome.FAILED, "again", 5.05, FIRST, MAX)
    assert [line.level for line in lines] == ["info"]  # patience: no warning yet
    assert s.register_failures == 2 and s.retry_at == 5.05 + 0.1


def test_already_connected_is_final_for_that_kubelet() -> None:
    s, _ = m.served(m.initial(m.KUBELET), True, "", 0.0, FIRST, MAX)
    s, lines = m.registered(s, K1, RegisterOutcome.ALREADY_CONNECTED, "already", 0.0, FIRST, MAX)
    assert [line.level for line in lines] == ["error"]
    assert "not retrying" in lines[0].text
    assert s.registrations == 0 and not s.wanted and s.registered_with == K1
    _, step = decide(s, ours=True, kubelet=K1, now=100.0)
    assert step.act is Act.WAIT


def test_kubelet_sock_gone_after_a_registration_starts_an_outage() -> None:
    s, step = decide(registered_state(), ours=True, kubelet=None)
    assert s.wanted and s.registered_with is None
    assert step.act is Act.WAIT and texts(step.lines) == ["waiting for {kubelet}"]


def test_another_kubelet_sock_is_registered_with() -> None:
    _, step = decide(registered_state(), ours=True, kubelet=K2)
    assert step.act is Act.REGISTER and step.kubelet == K2


def test_a_vanished_socket_is_a_kubelet_start_even_with_the_same_kubelet_inode() -> None:
    s, step = decide(registered_state(), ours=False, kubelet=K1)
    assert step.act is Act.SERVE
    assert texts(step.lines) == ["socket {socket} vanished (kubelet restarted?); serving again"]
    assert s.wanted and s.registered_with is None and not s.served
    s, _ = m.served(s, True, "", 0.0, FIRST, MAX)
    _, step = decide(s, ours=True, kubelet=K1)  # the new kubelet got the old inode
    assert step.act is Act.REGISTER and step.kubelet == K1


def test_each_outage_says_waiting_once_even_if_the_last_never_registered() -> None:
    """The issue's log: an outage that ended without a registration left the flag set, and the
    next outage said nothing."""
    s, _ = m.served(m.initial(m.KUBELET), True, "", 0.0, FIRST, MAX)
    s, step = decide(s, ours=True, kubelet=None)
    assert texts(step.lines) == ["waiting for {kubelet}"]
    s, step = decide(s, ours=False, kubelet=None)  # the next restart, still unregistered
    s, _ = m.served(s, True, "", 0.0, FIRST, MAX)
    s, step = decide(s, ours=True, kubelet=None)
    assert texts(step.lines) == ["waiting for {kubelet}"]


def test_failures_of_the_last_kubelet_do_not_delay_the_next() -> None:
    s, _ = m.served(m.initial(m.KUBELET), True, "", 0.0, FIRST, MAX)
    for _ in range(6):
        s, _ = m.registered(s, K1, RegisterOutcome.FAILED, "x", 0.0, FIRST, MAX)
    s, step = decide(s, ours=False, kubelet=K2, now=0.0)
    s, _ = m.served(s, True, "", 0.0, FIRST, MAX)
    _, step = decide(s, ours=True, kubelet=K2, now=0.0)
    assert step.act is Act.REGISTER


def test_watcher_mode_serves_and_never_registers() -> None:
    s = m.initial(m.WATCHER)
    s, step = decide(s, ours=False)
    assert step.act is Act.SERVE
    s, _ = m.served(s, True, "", 0.0, FIRST, MAX)
    s, step = decide(s, ours=True)
    assert step.act is Act.WAIT and step.wait_s == RECHECK and step.lines == ()
    s, step = decide(s, ours=False)
    assert step.act is Act.SERVE and len(step.lines) == 1 and not s.wanted


# ------------------------------------------------------------------ random kubelet lives


@dataclass
class Kubelet:
    """The v1.37.2 kubelet's side, as the field notes describe it: a start wipes our socket and
    listens on a new kubelet.sock (maybe on the old inode); Register dials our socket back
    (failing if it is not there) and refuses an endpoint already connected."""

    generation: int = 1
    inode: m.Identity | None = K1
    connected: bool = False  # our endpoint, in this generation
    ours: bool = False  # our socket file is in place
    accepted: dict[int, int] = field(default_factory=dict)
    refused: int = 0
    starts: int = 0

    def stop(self) -> None:
        self.inode = None

    def start(self, inode: m.Identity) -> None:
        self.ours = False
        self.generation += 1
        self.inode = inode
        self.connected = False
        self.starts += 1

    def register(self) -> RegisterOutcome:
        if self.inode is None or not self.ours:
            return RegisterOutcome.FAILED  # nothing listens / cannot dial the plugin back
        if self.connected:
            self.refused += 1
            return RegisterOutcome.ALREADY_CONNECTED
        self.connected = True
        self.accepted[self.generation] = self.accepted.get(self.generation, 0) + 1
        return RegisterOutcome.REGISTERED


world_op = st.one_of(
    st.just(("stop",)),
    st.tuples(st.just("start"), st.sampled_from([K1, K2])),
    st.tuples(st.just("restart"), st.sampled_from([K1, K2])),  # stop + start at once
)
# each machine step may see the world change between its look and its action (a stale look)
machine_step = st.tuples(st.just("step"), st.one_of(st.none(), world_op))
script = st.lists(st.one_of(world_op, machine_step), max_size=60)


def apply(world: Kubelet, op: tuple[object, ...]) -> None:
    if op[0] in ("stop", "restart"):
        world.stop()
    if op[0] in ("start", "restart"):
        assert isinstance(op[1], tuple)
        world.start(op[1])


def run_step(s: State, world: Kubelet, now: float, between: tuple[object, ...] | None):
    s, step = m.decide(s, Look(world.ours, world.inode, now), RECHECK)
    lines = list(step.lines)
    if between is not None:
        apply(world, between)
    if step.act is Act.SERVE:
        world.ours = True
        s, more = m.served(s, True, "", now, FIRST, MAX)
        lines += more
        return s, lines, now
    if step.act is Act.REGISTER:
        assert step.kubelet is not None
        outcome = world.register()
        s, more = m.registered(s, step.kubelet, outcome, "why", now, FIRST, MAX)
        return s, lines + list(more), now
    assert step.wait_s is not None
    return s, lines, now + min(step.wait_s, 0.01)


@given(script)
def test_every_kubelet_start_is_registered_with_once_and_never_twice(ops) -> None:
    world, s, now, lines = Kubelet(), m.initial(m.KUBELET), 0.0, []
    for op in ops:
        if op[0] == "step":
            s, more, now = run_step(s, world, now, op[1])
            lines += more
        else:
            apply(world, op)
    if world.inode is None:
        world.start(K1)
    for _ in range(200):  # quiet from now on: it settles
        s, more, now = run_step(s, world, now, None)
        lines += more
    assert world.refused == 0, "a second Register reached a kubelet it was connected to"
    assert all(n == 1 for n in world.accepted.values())
    assert world.accepted.get(world.generation) == 1, "the running kubelet was not registered"
    assert world.ours and s.registered_with == world.inode and not s.wanted
    assert s.registrations == sum(world.accepted.values())
    waiting = sum("waiting for" in line.text for line in lines)
    assert waiting <= world.starts + 1 + sum(op[0] == "stop" for op in ops)


def test_a_kubelet_that_keeps_failing_is_warned_about_once() -> None:
    s, _ = m.served(m.initial(m.KUBELET), True, "", 0.0, FIRST, MAX)
    said = []
    for i in range(m.PATIENCE + 2):
        s, lines = m.registered(s, K1, RegisterOutcome.FAILED, "cannot connect", i, FIRST, MAX)
        said += [(line.level, line.text) for line in lines]
    warnings = [text for level, text in said if level == "warning"]
    assert warnings == ["cannot register at {kubelet} (cannot connect); retrying until it answers"]
    assert len(said) == m.PATIENCE
