"""The resource vocabulary: which extended resources are GPUs, exclusive HCA pools and shared
pools, and the named resource vector every layer counts them in. Pure.

Every component reads the same names: the agent publishes them in the NodeResourceTopology
(`to_attribute`), the extender and the webhook take the cluster's default from their config,
placement counts a pod's devices per name (`Amounts`). A name is never a position: a pool renamed
in the DevicePluginConfig (`rdma/hca_shared_devices_a`, `example.com/ib`) or a second GPU
vendor (`amd.com/gpu`) is as visible as the defaults.

- **gpu**: one device is one GPU;
- **exclusive**: one device is one HCA (rdmaplane's exclusive pool, `rdmaplane.io/hca`);
- **shared**: one device is a slot that grants every HCA of the pool (`rdmaplane.io/hca-shared`,
  the shared RDMA device plugin's `rdma/...` pools).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, get_args

from rdmaplane.core import names
from rdmaplane.core.errors import InputError
from rdmaplane.core.settings import Names, setting

GPU = "nvidia.com/gpu"
HCA = names.HCA
HCA_SHARED = names.HCA_SHARED

Kind = Literal["gpu", "exclusive", "shared"]
Mode = Literal["exclusive", "shared"]  # a pool's kind: how its devices map to HCAs
KINDS: tuple[Kind, ...] = get_args(Kind)
DEFAULT_POOL = {"exclusive": HCA, "shared": HCA_SHARED}  # a pool's name when none is given


class VocabularyError(InputError):
    """Resource names that cannot be told apart (a name of two kinds) or read."""


def is_extended(name: str) -> bool:
    """An extended resource (upstream `IsExtendedResourceName`): a domain-prefixed name that is
    not a native one (`kubernetes.io/...`) or a quota's `requests.` form. Only these can be
    devices of a device plugin."""
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


@dataclass(frozen=True)
class Vocabulary:
    """The names of the GPU resources and of the HCA pools by mode, each list in the order
    results list them (GPUs, exclusive pools, shared pools). The extender's and the webhook's
    `resources` settings too (each a name or a list in their files); an NRT whose agent names
    its own (`rdmaplane.io/resources`) is read by those. (Not slotted: the name → kind index
    is cached beside the fields.)"""

    gpus: Names = setting(
        (GPU,), "GPUs: a name, or a list (one per GPU vendor)", key="gpu", min_length=1
    )
    exclusive: Names = setting(
        (HCA,),
        "exclusive HCA pools: a name or a list (the webhook adds the first)",
        key="hca",
        min_length=1,
    )
    shared: Names = setting(
        (HCA_SHARED,),
        "shared pools: a name or a list (the webhook adds the first)",
        key="hcaShared",
        min_length=1,
    )

    def __post_init__(self) -> None:
        self._kinds  # noqa: B018 (checked as it is built)

    @cached_property
    def _kinds(self) -> dict[str, Kind]:
        """Each name's kind; refuses a name that is not an extended resource or is of two."""
        kinds: dict[str, Kind] = {}
        for kind, given in zip(KINDS, (self.gpus, self.exclusive, self.shared), strict=True):
            for name in given:
                if not is_extended(name) or "," in name or "=" in name:
                    raise VocabularyError(f"{name!r} is not an extended resource name")
                if name in kinds:
                    raise VocabularyError(f"{name} is named as {kinds[name]} and as {kind}")
                kinds[name] = kind
        return kinds

    @classmethod
    def of(cls, gpus: Iterable[str], pools: Iterable[tuple[str, Mode]]) -> Vocabulary:
        """GPU names and device-plugin pools as (resource name, mode)."""
        pools = list(pools)
        return cls(
            tuple(dict.fromkeys(gpus)),
            tuple(dict.fromkeys(n for n, m in pools if m == "exclusive")),
            tuple(dict.fromkeys(n for n, m in pools if m == "shared")),
        )

    @property
    def names(self) -> tuple[str, ...]:
        return (*self.gpus, *self.exclusive, *self.shared)

    @property
    def rooted(self) -> tuple[str, ...]:
        """The resources whose every device sits on one PCIe root: GPUs and exclusive HCAs (a
        shared slot grants its whole pool, wherever its HCAs are)."""
        return (*self.gpus, *self.exclusive)

    def kind(self, name: str) -> Kind | None:
        return self._kinds.get(name)

    def within(self, other: Vocabulary) -> bool:
        """Whether `other` names each of these resources, as the same kind."""
        return all(other.kind(n) == k for n, k in self._kinds.items())

    def with_defaults(self, default: Vocabulary) -> Vocabulary:
        """These names, then `default`'s that these do not name (a name keeps this kind)."""
        rest = [n for n in default.names if n not in self._kinds]
        return Vocabulary(
            (*self.gpus, *(n for n in rest if default.kind(n) == "gpu")),
            (*self.exclusive, *(n for n in rest if default.kind(n) == "exclusive")),
            (*self.shared, *(n for n in rest if default.kind(n) == "shared")),
        )

    def wants_rdma(self, amounts: Mapping[str, int]) -> bool:
        return any(self._kinds.get(n) in ("exclusive", "shared") for n in amounts)

    def to_attribute(self) -> str:
        """The NRT attribute's value: `name=kind` pairs, comma-separated, in order."""
        return ",".join(f"{n}={self._kinds[n]}" for n in self.names)

    @classmethod
    def from_attribute(cls, value: str) -> Vocabulary:
        by_kind: dict[str, list[str]] = {k: [] for k in KINDS}
        for pair in filter(None, value.split(",")):
            name, _, kind = pair.partition("=")
            if kind not in by_kind:
                kinds = "|".join(KINDS)
                raise VocabularyError(f"{pair!r}: expected name=kind, kind one of {kinds}")
            by_kind[kind].append(name)
        return cls(*(tuple(by_kind[k]) for k in KINDS))


DEFAULT = Vocabulary()


class Amounts(dict[str, int]):
    """A named resource vector: a count per resource name. Like a frozen `collections.Counter`:
    a name it does not hold counts 0, zeros are left out, `+`/`-` add and subtract per name and
    `|` takes the larger count; immutable and hashable, so requests and node states built of
    it can be memo keys. A dict underneath: reading a count is a C-level lookup."""

    __slots__ = ("_hash",)

    def __init__(self, counts: Mapping[str, int] | Iterable[tuple[str, int]] = ()) -> None:
        super().__init__(counts)
        if 0 in self.values():  # one C-level pass; most vectors have no zero to drop
            for name in [k for k, v in self.items() if not v]:
                dict.__delitem__(self, name)
        self._hash: int | None = None

    def __missing__(self, name: str) -> int:
        return 0

    def __hash__(self) -> int:  # type: ignore[override]
        if self._hash is None:
            self._hash = hash(frozenset(self.items()))
        return self._hash

    def __repr__(self) -> str:
        return f"Amounts({dict(self)!r})"

    def __reduce__(self) -> tuple[type[Amounts], tuple[dict[str, int]]]:  # copy, pickle
        return Amounts, (dict(self),)

    def _frozen(self, *args: object, **kwargs: object) -> None:
        raise TypeError("Amounts is immutable")

    __setitem__ = __delitem__ = update = setdefault = pop = popitem = clear = _frozen  # type: ignore[assignment]
    __ior__ = _frozen  # type: ignore[assignment]

    def __add__(self, other: Mapping[str, int]) -> Amounts:
        out = dict(self)
        for k, v in other.items():
            out[k] = out.get(k, 0) + v
        return Amounts(out)

    def __sub__(self, other: Mapping[str, int]) -> Amounts:
        out = dict(self)
        for k, v in other.items():
            out[k] = out.get(k, 0) - v
        return Amounts(out)

    def __or__(self, other: Mapping[str, int]) -> Amounts:  # type: ignore[override]
        out = dict(self)
        for k, v in other.items():
            out[k] = max(out.get(k, 0), v)
        return Amounts(out)

    def only(self, names: Iterable[str]) -> Amounts:
        """The counts of `names` alone."""
        return Amounts((n, self.get(n, 0)) for n in names)

    def total(self) -> int:
        return sum(self.values())


NONE = Amounts()
