"""PyTorch checkpoints a job resumes from bit for bit (import this module only where torch is
installed; the rest of `rdmaplane.train` needs nothing but the standard library).

Two layouts, one interface (`resume`, `step_done`, `save`, `close`):

- `Checkpoints`: replicated state (DDP, or one process). Rank 0 writes one atomic file per
  step (`rdmaplane.train.checkpoint`: SHA-256 checked, torn files skipped).
- `ShardedCheckpoints`: sharded state (FSDP, tensor parallel) through
  `torch.distributed.checkpoint`: each rank writes its shard into a staging folder, rank 0
  commits the step with one rename once every shard is on disk; an uncommitted (torn) step is
  never resumed from.

Both record, beside the model, optimizer and any `state_dict`/`load_state_dict` objects (an LR
scheduler), each rank's random state (`rdmaplane.train.rng`) and the fault notices the
checkpoint answered (`FaultNotice.answered`), and put them back on `resume`.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import shutil
import threading
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined, unused-ignore]
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from rdmaplane.train import checkpoint, rng
from rdmaplane.train.checkpoint import CheckpointError, CheckpointWarning
from rdmaplane.train.notice import FaultNotice
from rdmaplane.train.rng import ResumeWarning

__all__ = [
    "Checkpoints",
    "ResumeWarning",
    "ShardedCheckpoints",
    "any_rank",
    "init_distributed",
]


class Stateful(Protocol):
    def state_dict(self) -> Mapping[str, Any]: ...
    def load_state_dict(self, state_dict: Mapping[str, Any]) -> Any: ...


def init_distributed(backend: str = "gloo", timeout_s: float = 1800.0) -> None:
    """`init_process_group` that survives torchrun's own restarts (`--max-restarts`).

    A restarted worker group meets in the agent's store again, where the previous round's
    workers left their addresses under the same keys: measured with torch 2.15 and gloo, the
    restarted ranks then dial dead peers ("Connection refused", or a hang until the timeout).
    Keying the group by `TORCHELASTIC_RESTART_COUNT` gives each round a clean slate. Outside
    torchrun this is plain `init_process_group(backend)`."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if restart is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        return
    world = int(os.environ["WORLD_SIZE"])
    store = TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
    )
    dist.init_process_group(
        backend,
        store=PrefixStore(f"rdmaplane/restart-{restart}", store),
        rank=int(os.environ["RANK"]),
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )


def _distributed() -> bool:
    return bool(dist.is_available() and dist.is_initialized())


def any_rank(flag: bool, group: Any = None) -> bool:
    """True on every rank of `group` (default: all) if it is true on any (an all-reduce MAX);
    `flag` when not distributed. On an NCCL group the flag travels on the current GPU."""
    if not _distributed():
        return flag
    nccl = str(dist.get_backend(group)) == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else None
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return bool(value.item())


class Checkpoints:
    """Checkpoints of replicated state: rank 0 writes `ckpt-<step>.rdmaplane` files into
    `directory` (every rank reads the newest valid one on `resume`).

    Every rank constructs it (the same way) after the model and optimizer; `step_done` is
    called by every rank after every step: it saves every `every` steps, and after a step on
    which any rank got the fault notice, when it returns True (exit 75 then). With
    `async_save`, periodic checkpoints are written in a background thread from a copy of the
    state, so training goes on; the next save (an emergency one too) waits for it first.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        every: int = 0,
        keep: int = 3,
        async_save: bool = False,
        **stateful: Stateful,
    ) -> None:
        if every < 0 or keep < 1:
            raise ValueError(f"every must be >= 0 and keep >= 1 (got every {every}, keep {keep})")
        self.directory = Path(directory)
        self.model, self.optimizer, self.stateful = model, optimizer, stateful
        self.every, self.keep, self.async_save = every, keep, async_save
        self.answered: frozenset[str] = frozenset()
        self.rank = dist.get_rank() if _distributed() else 0
        self.world = dist.get_world_size() if _distributed() else 1
        # Our collectives (gather, agreement, DCP's) on CPU tensors and apart from training's.
        self._group = _own_group() if _distributed() else None
        self._pending: _Background | None = None

    # ------------------------------------------------------------------ the loop's calls

    def resume(self) -> int:
        """Load the newest valid checkpoint into the model, optimizer, stateful objects and this
        rank's RNGs; the step to start from (0 when there is none)."""
        found = self._load()
        if found is None:
            return 0
        step, record = found
        for name, obj in self.stateful.items():
            if name in record["stateful"]:
                obj.load_state_dict(record["stateful"][name])
            else:
                warnings.warn(f"step {step} holds no state for {name!r}", ResumeWarning, 2)
        self.answered = frozenset(record["answered"])
        ranks = record["ranks"]
        if len(ranks) != self.world:
            warnings.warn(
                f"step {step} was saved by {len(ranks)} ranks and is resumed by {self.world}: "
                "the random state is not restored",
                ResumeWarning,
                stacklevel=2,
            )
        else:
            rng.restore(ranks[self.rank])
        return step

    def step_done(self, done: int, notice: FaultNotice | None = None) -> bool:
        """After every step (`done` steps done): save when due; True when any rank got the
        notice and this checkpoint answers it."""
        stop = any_rank(notice is not None and notice.is_set())
        if stop:
            self.save(done, notice)
        elif self.every and done % self.every == 0:
            self.save(done, notice, background=self.async_save)
        return stop

    def save(
        self, step: int, notice: FaultNotice | None = None, *, background: bool = False
    ) -> None:
        """Save `step` (every rank calls it). In the foreground it returns once the checkpoint
        is on disk, on every rank; `CheckpointError` on every rank if it could not be."""
        self.wait()
        answered = notice.answered if notice is not None else self.answered
        mine = {"rng": rng.capture(), "answered": sorted(answered)}
        gathered = self._gather(mine)
        record = None
        if gathered is not None:  # a copy: a background save writes it later
            record = _detached(
                {
                    "ranks": [g["rng"] for g in gathered],
                    "answered": sorted({a for g in gathered for a in g["answered"]}),
                    "stateful": {name: obj.state_dict() for name, obj in self.stateful.items()},
                }
            )
        write = self._writer(step, record, copy=background)
        if background:
            self._pending = _Background(step, write)
        else:
            self._agree(_outcome(write), step)

    def wait(self) -> None:
        """Wait for a background save; `CheckpointError` on every rank if it failed."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._agree(pending.outcome(), pending.step)

    def close(self) -> None:
        self.wait()

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the layout

    def _load(self) -> tuple[int, Mapping[str, Any]] | None:
        for found in checkpoint.valid(self.directory):
            try:
                with found.open() as f:
                    state = torch.load(f, map_location="cpu", weights_only=True)
            except Exception as e:  # a payload torch cannot read is skipped like a torn file
                warnings.warn(f"skipping checkpoint {found.path}: {e}", CheckpointWarning, 2)
                continue
            self.model.load_state_dict(state["model"])
            if self.optimizer is not None:
                self.optimizer.load_state_dict(state["optimizer"])
            return found.step, state["rdmaplane"]
        return None

    def _writer(
        self, step: int, record: Mapping[str, Any] | None, *, copy: bool
    ) -> Callable[[], None]:
        """This rank's part of writing `step`: rank 0's the file, the others' nothing. With
        `copy`, from a copy of the state (it runs while training goes on)."""
        if record is None:
            return lambda: None
        state: dict[str, Any] = {"model": self.model.state_dict(), "rdmaplane": record}
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
        if copy:
            state = _detached(state)

        def write() -> None:
            checkpoint.save_with(
                self.directory, step, lambda out: torch.save(state, out), keep=self.keep
            )

        return write

    # ------------------------------------------------------------------ our collectives

    def _gather(self, obj: Any) -> list[Any] | None:
        """`obj` of every rank on rank 0 (None elsewhere), as tensors: torch's object
        collectives need numpy, which training pods need not have."""
        if self._group is None:
            return [obj]
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        data = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(sizes, torch.tensor([data.numel()]), group=self._group)
        longest = max(int(s) for s in sizes)
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[: data.numel()] = data
        slots = [torch.zeros_like(padded) for _ in sizes] if self.rank == 0 else None
        dist.gather(padded, slots, dst=0, group=self._group)
        if slots is None:
            return None
        raw = [bytes(s[: int(n)].tolist()) for s, n in zip(slots, sizes, strict=True)]
        return [torch.load(io.BytesIO(r), weights_only=True) for r in raw]

    def _agree(self, error: BaseException | None, step: int) -> None:
        """Every rank learns whether every rank's part of `step` was written."""
        failed = any_rank(error is not None, self._group)
        if error is not None:
            raise error
        if failed:
            raise CheckpointError(f"{self.directory}: another rank could not save step {step}")


def _own_group() -> dist.ProcessGroup:
    """A gloo group of all ranks, for our collectives."""
    group = dist.new_group(backend="gloo")
    assert isinstance(group, dist.ProcessGroup)  # every rank is a member
    return group


def _outcome(write: Callable[[], None]) -> BaseException | None:
    try:
        write()
    except Exception as e:
        return e
    return None


class _Background:
    """One rank's part of saving `step`, in a thread; its outcome once it is done."""

    def __init__(self, step: int, write: Callable[[], None]) -> None:
        self.step = step
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(write,), name="rdmaplane-save")
        self._thread.start()

    def _run(self, write: Callable[[], None]) -> None:
        self._error = _outcome(write)

    def outcome(self) -> BaseException | None:
        self._thread.join()
        return self._error


def _detached(obj: Any) -> Any:
    """A copy of a state dict with every tensor copied to CPU memory: what training does next
    cannot change what is being written."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, Mapping):
        return {k: _detached(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_detached(v) for v in obj)
    return obj


# ---------------------------------------------------------------------- sharded state


class ShardedCheckpoints(Checkpoints):
    """Checkpoints of sharded state (FSDP's `fully_shard`, tensor parallel) through
    `torch.distributed.checkpoint`: `step-<step>/` folders on a file system every rank sees.

    Each rank writes its shard into `.step-<step>.partial/` (DCP's files, fsynced; DCP writes
    its `.metadata` once all are written); rank 0 then adds our record (random states, notices,
    file sizes) as a checkpoint file, and commits the step by renaming the folder (the parent
    fsynced). On resume rank 0 picks the newest committed step whose files are all there with
    their sizes; every rank loads its part (`dcp.load`, resharding if the world changed), and
    an older step is tried if DCP cannot read it. Background saves use `dcp.async_save`.
    """

    RECORD_STEP = 0  # the record file inside a step folder: `ckpt-000000000000.rdmaplane`

    def _state(self) -> dict[str, Any]:
        optimizers = [self.optimizer] if self.optimizer is not None else []
        model, optim = get_state_dict(self.model, optimizers)
        return {"model": model, "optim": optim}

    def _load(self) -> tuple[int, Mapping[str, Any]] | None:
        if self.rank == 0:
            _remove_partials(self.directory)
        tried: set[int] = set()
        while (step := self._broadcast(self._newest_committed(tried))) >= 0:
            tried.add(step)
            folder = _step_folder(self.directory, step)
            state = self._state()
            try:
                dcp_load(state, checkpoint_id=folder, process_group=self._group)
            except Exception as e:  # raised on every rank alike: DCP gathers read failures
                if self.rank == 0:
                    warnings.warn(f"skipping checkpoint {folder}: {e}", CheckpointWarning, 2)
                continue
            set_state_dict(
                self.model,
                [self.optimizer] if self.optimizer is not None else [],
                model_state_dict=state["model"],
                optim_state_dict=state["optim"],
            )
            record = _read_record(folder)
            assert record is not None  # verified by rank 0 a moment ago
            return step, record
        return None

    def _newest_committed(self, tried: set[int]) -> int:
        """(Rank 0) the newest committed step not tried yet whose files are complete; -1."""
        if self.rank != 0:
            return -1
        for step in _committed_steps(self.directory):
            if step in tried:
                continue
            folder = _step_folder(self.directory, step)
            why = _incomplete(folder)
            if why is None:
                return step
            warnings.warn(f"skipping checkpoint {folder}: {why}", CheckpointWarning, 3)
        return -1

    def _broadcast(self, value: int) -> int:
        if self._group is None:
            return value
        tensor = torch.tensor([value], dtype=torch.int64)
        dist.broadcast(tensor, src=0, group=self._group)
        return int(tensor.item())

    def _writer(
        self, step: int, record: Mapping[str, Any] | None, *, copy: bool
    ) -> Callable[[], None]:
        """Every rank writes its shard into the staging folder, then rank 0 commits. With
        `copy`, `dcp.async_save` copies the shards to CPU memory now and writes them while
        training goes on."""
        staging = self.directory / f".step-{step:012d}.partial"
        if self.rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
        if self._group is not None:
            dist.barrier(group=self._group)  # nobody writes into a folder being cleared
        state = self._state()
        commit = self._committer(step, staging, record)
        if copy:
            future = dcp_async_save(state, checkpoint_id=staging, process_group=self._group)
            assert isinstance(future, Future)  # the thread executor's, not a staging pair

            def finish() -> None:
                future.result()
                commit()

            return finish

        def write() -> None:
            dcp_save(state, checkpoint_id=staging, process_group=self._group)
            commit()

        return write

    def _committer(
        self, step: int, staging: Path, record: Mapping[str, Any] | None
    ) -> Callable[[], None]:
        """(Rank 0) once DCP returned, every shard is on disk: record, then one rename."""
        if record is None:
            return lambda: None

        def commit() -> None:
            files = {p.name: p.stat().st_size for p in staging.iterdir()}
            done = {**record, "files": files}
            checkpoint.save_with(staging, self.RECORD_STEP, lambda out: torch.save(done, out))
            checkpoint.fsync_dir(staging)
            final = _step_folder(self.directory, step)
            aside = self.directory / f".step-{step:012d}.old-{secrets.token_hex(4)}"
            with contextlib.suppress(FileNotFoundError):
                final.rename(aside)  # a step saved again after resuming from an older one
            staging.rename(final)
            checkpoint.fsync_dir(self.directory)
            shutil.rmtree(aside, ignore_errors=True)
            for old in _committed_steps(self.directory)[self.keep :]:
                shutil.rmtree(_step_folder(self.directory, old), ignore_errors=True)

        return commit


def _step_folder(directory: Path, step: int) -> Path:
    return directory / f"step-{step:012d}"


def _committed_steps(directory: Path) -> list[int]:
    """Steps with a committed folder, newest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    steps = [int(n[5:]) for n in names if n.startswith("step-") and n[5:].isdigit()]
    return sorted(steps, reverse=True)


def _remove_partials(directory: Path) -> None:
    """What saves that never committed left (a killed job): warned about, then removed."""
    with contextlib.suppress(FileNotFoundError):
        for name in sorted(os.listdir(directory)):
            if name.startswith(".step-"):
                if name.endswith(".partial"):
                    warnings.warn(
                        f"removing {directory / name}: a save that never committed (torn step)",
                        CheckpointWarning,
                        4,
                    )
                shutil.rmtree(directory / name, ignore_errors=True)


def _read_record(folder: Path) -> Mapping[str, Any] | None:
    found = checkpoint.latest(folder)
    if found is None:
        return None
    with found.open() as f:
        record: Mapping[str, Any] = torch.load(f, weights_only=True)
    return record


def _incomplete(folder: Path) -> str | None:
    """Why a committed step cannot be trusted: its record unreadable, a file missing or of
    another size than when it was committed; None if it is whole."""
    try:
        record = _read_record(folder)
    except Exception as e:
        return f"unreadable record ({e})"
    if record is None:
        return "no record"
    for name, size in record["files"].items():
        try:
            got = (folder / name).stat().st_size
        except OSError as e:
            return f"{name}: {e.strerror}"
        if got != size:
            return f"{name}: {got} of {size} bytes"
    return None
