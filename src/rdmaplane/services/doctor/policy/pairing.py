"""Which nodes test against which: pairs that cover every node, and the Jobs that run them.

Pairs are formed in sorted name order so reruns give the same pairs. With an odd count the last
node pairs with the first in a second round, so no node runs two tests at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rdmaplane.core import names
from rdmaplane.core.errors import InputError
from rdmaplane.core.resources import HCA
from rdmaplane.core.workloads import with_template

APP = "rdmaplane-doctor"
SERVICE = "rdmaplane-doctor"


@dataclass(frozen=True, slots=True)
class Pair:
    server: str
    client: str
    round: int  # pairs of one round run at the same time


class PairingError(InputError):
    """Nodes that cannot be paired (fewer than two distinct ones)."""


def cover_pairs(nodes: list[str]) -> list[Pair]:
    """Raises `PairingError` when fewer than two distinct nodes are given."""
    names = sorted(set(nodes))
    if len(names) < 2:
        raise PairingError(f"need at least two distinct nodes, got {len(names)}")
    pairs = [Pair(names[i], names[i + 1], 0) for i in range(0, len(names) - 1, 2)]
    if len(names) % 2:
        pairs.append(Pair(names[-1], names[0], 1))
    return pairs


def namespace_object(namespace: str) -> dict[str, Any]:
    """The doctor's Namespace, as the shipped example has it: Pod Security level privileged,
    since its pods add IPC_LOCK (which neither baseline nor restricted admits) and run as root
    (IPC_LOCK is effective only for root); everything else of restricted they meet."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": namespace,
            "labels": {"pod-security.kubernetes.io/enforce": "privileged"},
        },
    }


def manifests(
    pairs: list[Pair],
    *,
    image: str,
    namespace: str = "rdmaplane-doctor",
    hcas: int = 1,
    resource: str = HCA,
    duration: int = 5,
) -> list[dict[str, Any]]:
    """A headless Service (so clients find servers by DNS) and one Job per role per pair.

    Pods are not privileged: they request `hcas` of `resource` (an RDMA pool), drop every
    capability but
    IPC_LOCK, and have a deadline and memory limit. Each prints the checks' and the perf test's
    `-o json` and exits 1 when either fails; `rdmaplane doctor report` merges the logs.
    """
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": SERVICE, "namespace": namespace, "labels": {"app": APP}},
            "spec": {
                "clusterIP": "None",
                "selector": {"app": APP},
                "publishNotReadyAddresses": True,
            },
        }
    ]
    for i, pair in enumerate(pairs):
        server = f"pair-{i}-server"
        rdma = {resource: str(hcas)}
        docs.append(_job(server, pair.server, pair, image, namespace, rdma, duration, None))
        peer = f"{server}.{SERVICE}.{namespace}.svc"
        docs.append(
            _job(f"pair-{i}-client", pair.client, pair, image, namespace, rdma, duration, peer)
        )
    return docs


# A pair's run: the checks, then the perf test, then out. A second-round pair first waits for
# the first round's tests on its nodes to finish (a fixed delay, docs/doctor.md's Limits).
ROUND_DELAY_S = 90
# The Job's wall-clock limit on top of that delay: the checks, the server waiting for its
# client, the runs; a pod still going then is killed and the Job fails (DeadlineExceeded).
DEADLINE_S = 600
# Requests so the scheduler counts the pod; memory limit above the /dev/shm emptyDir (memory
# volumes count against it). No CPU limit: CFS throttling would distort what it measures.
RESOURCES = {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"memory": "3Gi"}}
SHM_SIZE = "2Gi"


def _job(
    name: str,
    node: str,
    pair: Pair,
    image: str,
    namespace: str,
    rdma: dict[str, str],
    duration: int,
    peer: str | None,
) -> dict[str, Any]:
    role = "--server" if peer is None else f"--client {peer}"
    # The wait is Python's, not sleep(1): an image with rdmaplane has Python, not always
    # coreutils (rdmaplane's own has none).
    wait = f"python3 -c 'import time; time.sleep({ROUND_DELAY_S})'; " if pair.round else ""
    # Both outputs are printed whatever the first says; the pod's exit status is the worse of
    # the two (1 for a FAIL), so the Job fails when RDMA does not work.
    script = (
        f"{wait}rdmaplane doctor -o json; checks=$?; "
        f"rdmaplane doctor perf {role} --duration {duration} -o json; perf=$?; "
        'exit "$((checks > perf ? checks : perf))"'
    )
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "nodeSelector": {"kubernetes.io/hostname": node},
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "doctor",
                "image": image,
                "command": ["/bin/sh", "-c", script],
                "env": [
                    {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
                ],
                "resources": {
                    "requests": {**RESOURCES["requests"], **rdma},
                    "limits": {**RESOURCES["limits"], **rdma},
                },
                # Root, for IPC_LOCK: Kubernetes gives a non-root container's processes no
                # effective capabilities (it sets no ambient set), so memory registration would
                # hit the memlock limit. Everything else is dropped.
                "securityContext": {
                    "runAsUser": 0,
                    "privileged": False,
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
                },
                "volumeMounts": [
                    {"name": "shm", "mountPath": "/dev/shm"},
                    {"name": "tmp", "mountPath": "/tmp"},
                ],
            }
        ],
        "volumes": [
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
        ],
    }
    if peer is None:
        pod["hostname"] = name
        pod["subdomain"] = SERVICE
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"{APP}-{name}",
            "namespace": namespace,
            "labels": {"app": APP, names.PAIR_LABEL: name.rsplit("-", 1)[0]},
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": DEADLINE_S + (ROUND_DELAY_S if pair.round else 0),
            "ttlSecondsAfterFinished": 3600,
        },
    }
    return with_template(job, {"metadata": {"labels": {"app": APP}}, "spec": pod})
