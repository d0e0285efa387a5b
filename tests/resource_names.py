"""Resource names other than the defaults, as the tests of every layer use them.

A second GPU vendor (`amd.com/gpu`), an exclusive pool renamed (`example.com/ib`) and the
network operator's shared pool (`rdma/hca_shared_devices_a`, the name the shared RDMA device
plugin's `configList` gives). Each layer is checked the same way: what it does on the renamed
node equals what it does on the default one with the names swapped (`renamed`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from rdmaplane.core import nrt
from rdmaplane.core.resources import Vocabulary

GPU, HCA, SHARED = "amd.com/gpu", "example.com/ib", "rdma/hca_shared_devices_a"
NAMES = {nrt.GPU: GPU, nrt.HCA: HCA, nrt.HCA_SHARED: SHARED}
VOCABULARY = Vocabulary((GPU,), (HCA,), (SHARED,))


# the names as they are and as a JSON pointer writes them (`rdmaplane.io~1hca`, RFC 6901)
_SWAPS = NAMES | {k.replace("/", "~1"): v.replace("/", "~1") for k, v in NAMES.items()}
_WORD = r"(?<![\w.-])({})(?![\w./-])"  # a name, not part of a longer one
_NAME = re.compile(_WORD.format("|".join(map(re.escape, sorted(_SWAPS, key=len, reverse=True)))))


def renamed(value: Any) -> Any:
    """`value` (a decoded JSON/YAML document) with every default resource name swapped,
    wherever it is: a key, a value, a word of a message, a JSON pointer's token."""
    if isinstance(value, dict):
        return {renamed(k): renamed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(renamed(v) for v in value)
    if isinstance(value, str):
        return _NAME.sub(lambda m: _SWAPS[m.group(1)], value)
    return value


def plugin_config(path: Path, names: dict[str, str] | None = None, slots: int = 4) -> Path:
    """A DevicePluginConfig with an exclusive and a shared pool side by side, both over every
    HCA, named by `names` (default: the default names); written to `path`."""
    names = names or {}
    doc = {
        "apiVersion": "rdmaplane.io/v1alpha1",
        "kind": "DevicePluginConfig",
        "pools": [
            {"resourceName": names.get(nrt.HCA, nrt.HCA), "mode": "exclusive"},
            {
                "resourceName": names.get(nrt.HCA_SHARED, nrt.HCA_SHARED),
                "mode": "shared",
                "slots": slots,
            },
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def without_vocabulary(obj: dict[str, Any]) -> dict[str, Any]:
    """An NRT object without its `rdmaplane.io/resources` attribute."""
    attrs = [a for a in obj["attributes"] if a["name"] != nrt.ATTR_RESOURCES]
    return {**obj, "attributes": attrs}
