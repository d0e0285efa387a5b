"""In-pod library for jobs that survive RDMA faults: atomic checkpoints, resume from the newest
valid one, and the fault notice (SIGTERM or the `rdmaplane.io/fault` annotation) that tells the
loop to save and exit with 75, "saved, restart me". Standard library only; PyTorch helpers in
`rdmaplane.train.pytorch` when torch is installed. See docs/faults.md.
"""

from rdmaplane.core.notice import ANNOTATION, notice_id
from rdmaplane.train.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointWarning,
    latest,
    load_object,
    save,
    save_object,
    save_with,
    valid,
)
from rdmaplane.train.notice import (
    EXIT_RESTART,
    FaultNotice,
    NoticeWarning,
    exit_for_restart,
    parse_annotations,
)

__all__ = [
    "ANNOTATION",
    "EXIT_RESTART",
    "Checkpoint",
    "CheckpointError",
    "CheckpointWarning",
    "FaultNotice",
    "NoticeWarning",
    "exit_for_restart",
    "latest",
    "load_object",
    "notice_id",
    "parse_annotations",
    "save",
    "save_object",
    "save_with",
    "valid",
]
