"""One kubelet-facing socket kept served, and registered: the I/O half of
`rdmaplane.core.registration`.

Used by every socket the kubelet dials: the device plugin's pools (`kubelet` mode: it calls
`Registration.Register` on `device-plugins/kubelet.sock`, once per kubelet start; or `watcher`
mode in `plugins_registry/`) and the DRA driver's two sockets (`watcher`: the kubelet's plugin
watcher finds the registration socket itself). The loop is the same for all:

    arm the inotify watch → look (our socket's identity, kubelet.sock's, the clock)
    → `decide` → serve | Register | wait for any change in the folder (or the step's timeout)

Nothing is decided on an event: an event only ends the wait, and the next look sees what it
changed; an event that came before the look is read at the next wait and costs one more look.
The state is this object's, so a supervised task restarted after a fault goes on from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

import grpc

from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from rdmaplane.adapters.kubelet.sockets import FolderEvents, ServeError, inode, serve
from rdmaplane.core import paths
from rdmaplane.core import registration as machine
from rdmaplane.core.registration import Act, Identity, Look, Mode, RegisterOutcome, State

KUBELET_SOCKET = paths.KUBELET_SOCKET
ALREADY_CONNECTED = "device plugin already connected"  # the kubelet's refusal of a second Register
REGISTER_TIMEOUT_S = 15.0  # the kubelet dials us back within it (10 s)
CONNECT_TIMEOUT_S = 0.5
_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


async def register(
    kubelet_socket: Path,
    request: dp.RegisterRequest,
    still_ours: Callable[[], bool] = lambda: True,
) -> tuple[RegisterOutcome, str]:
    """One `Registration.Register` call: its outcome, and why when it failed or was refused.

    The connection is made first, within `CONNECT_TIMEOUT_S`, and the Register sent only on it
    and only if `still_ours()`: a kubelet we are connected to has started listening, and a
    kubelet wipes our socket before it listens, so a Register is never sent to a kubelet that
    has deleted our socket (it would dial us back in vain for 10 s, then fail). Until the
    Register is sent nothing reached the kubelet, so giving up then is safe; once it is sent,
    its answer is awaited (giving up then could leave it registered, and a second Register
    fatal). A connection that stays in CONNECTING (seen here under heavy load: the socket
    connect never completing while kubelets came and went) is given up after the timeout.
    The channel is its own (a local subchannel pool): gRPC would otherwise share a connection
    with another channel to the same path, possibly one to a kubelet that is going away."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}", options=options) as ch:
        problem = await _connect(ch)
        if problem is None and not still_ours():
            problem = "our socket vanished before the Register was sent"
        if problem is not None:
            return RegisterOutcome.FAILED, problem
        try:
            kubelet = dp_grpc.RegistrationStub(ch)  # type: ignore[no-untyped-call]
            await kubelet.Register(request, timeout=REGISTER_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            details = e.details() or ""
            if ALREADY_CONNECTED in details:
                return RegisterOutcome.ALREADY_CONNECTED, details
            return RegisterOutcome.FAILED, f"{e.code().name}: {details}"
    return RegisterOutcome.REGISTERED, ""


async def _connect(ch: grpc.aio.Channel) -> str | None:
    """Connect `ch`: None once READY, else why not (a failed connect fails at once)."""
    deadline = asyncio.get_running_loop().time() + CONNECT_TIMEOUT_S
    state = ch.get_state(try_to_connect=True)
    while state is not grpc.ChannelConnectivity.READY:
        if state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN):
            return "cannot connect"
        left = deadline - asyncio.get_running_loop().time()
        try:
            await asyncio.wait_for(ch.wait_for_state_change(state), max(left, 0.0))
        except TimeoutError:
            return f"not connected within {CONNECT_TIMEOUT_S:g} s"
        state = ch.get_state(try_to_connect=True)
    return None


class KeptSocket:
    """A gRPC server on `path`, served again whenever the file is not ours; in `kubelet` mode
    also registered once per kubelet start with `request()`."""

    def __init__(
        self,
        path: Path,
        add_servicers: Callable[[grpc.aio.Server], None],
        owner: str,
        log: logging.Logger,
        *,
        mode: Mode = machine.WATCHER,
        kubelet_socket: Path | None = None,
        request: Callable[[], dp.RegisterRequest] | None = None,
        recheck_s: float = 30.0,
        first_backoff_s: float = 0.05,
        max_backoff_s: float = 5.0,
    ) -> None:
        if mode == machine.KUBELET and (kubelet_socket is None or request is None):
            raise ValueError("kubelet mode needs the kubelet socket and a Register request")
        self.path = path
        self.add_servicers = add_servicers
        self.owner = owner
        self.log = log
        self.kubelet_socket = kubelet_socket
        self.request = request
        self.recheck_s = recheck_s  # a safety net: inotify tells first
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self.state: State = machine.initial(mode)
        self.server: grpc.aio.Server | None = None
        self.served: Identity | None = None  # our socket's identity, while it is ours
        # a Register sent and not yet answered, with the kubelet.sock it went to: it belongs to
        # this object, not to the loop's task, so a loop cancelled or restarted meanwhile
        # waits for its answer instead of sending a second one (fatal, see the core)
        self._in_flight: tuple[Identity, asyncio.Task[tuple[RegisterOutcome, str]]] | None = None

    @property
    def registrations(self) -> int:
        return self.state.registrations

    # ------------------------------------------------------------------ the I/O

    def ours(self) -> bool:
        """Our socket is in place: the file at `path` is the one we bound (no other file can
        get its inode while our listening socket holds it)."""
        return self.served is not None and inode(self.path) == self.served

    def look(self) -> Look:
        kubelet = inode(self.kubelet_socket) if self.kubelet_socket is not None else None
        return Look(self.ours(), kubelet, asyncio.get_running_loop().time())

    async def serve(self) -> None:
        """A new server on our socket (`sockets.serve`); then the old server stops (its streams
        belong to a kubelet that is gone). `ServeError` when the socket cannot be made."""
        server, served = await serve(self.path, self.add_servicers, self.owner)
        old, self.server, self.served = self.server, server, served
        if old is not None:
            await old.stop(grace=None)
        self.state, lines = machine.served(self.state, True, "", 0.0, 0.0, 0.0)
        self._write(lines)

    async def close(self) -> None:
        """Stop serving; remove the socket if it is still ours."""
        if self._in_flight is not None:
            self._in_flight[1].cancel()
            self._in_flight = None
        if self.server is not None:
            await self.server.stop(grace=0.2)
            self.server = None
        if self.ours():
            with contextlib.suppress(OSError):
                self.path.unlink()
        self.served = None

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Keep served (and registered) for good; a task of the service's `Supervisor`."""
        if self._in_flight is not None:  # sent by a loop that was cancelled or failed
            await self._register_step(self._in_flight[0])
        with FolderEvents(self.path.parent, self.path.parent.parent) as events:
            while True:
                events.watch()
                self.state, step = machine.decide(self.state, self.look(), self.recheck_s)
                self._write(step.lines)
                if step.act is Act.SERVE:
                    await self._serve_step()
                elif step.act is Act.REGISTER:
                    assert step.kubelet is not None
                    await self._register_step(step.kubelet)
                else:
                    await events.changed(step.wait_s)

    async def _serve_step(self) -> None:
        try:
            await self.serve()
        except ServeError as e:
            now = asyncio.get_running_loop().time()
            self.state, lines = machine.served(
                self.state, False, str(e), now, self.first_backoff_s, self.max_backoff_s
            )
            self._write(lines)

    async def _register_step(self, kubelet: Identity) -> None:
        assert self.kubelet_socket is not None and self.request is not None
        if self._in_flight is None:
            call = register(self.kubelet_socket, self.request(), self.ours)
            self._in_flight = kubelet, asyncio.ensure_future(call)
        kubelet, task = self._in_flight
        try:
            outcome, why = await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.cancelled():
                raise  # our loop was cancelled: the call goes on, and its answer is kept
            outcome, why = RegisterOutcome.FAILED, "cancelled"
        except Exception as e:  # an unexpected failure of the call: retried
            outcome, why = RegisterOutcome.FAILED, f"{type(e).__name__}: {e}"
        self._in_flight = None
        now = asyncio.get_running_loop().time()
        self.state, lines = machine.registered(
            self.state, kubelet, outcome, why, now, self.first_backoff_s, self.max_backoff_s
        )
        self._write(lines)

    def _write(self, lines: tuple[machine.Line, ...]) -> None:
        for line in lines:
            text = line.text.replace("{socket}", str(self.path))
            text = text.replace("{kubelet}", str(self.kubelet_socket))
            self.log.log(_LEVELS[line.level], "%s: %s", self.owner, text)
