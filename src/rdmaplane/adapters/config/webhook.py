"""`WebhookConfig`: what `rdmaplane webhook` adds to GPU pods and where its serving certificate
comes from (`rdmaplane webhook --config`, `rdmaplane inject --config`; docs/webhook.md), read
into `rdmaplane.core.settings.webhook.WebhookSettings`."""

from __future__ import annotations

from typing import Final

from rdmaplane.adapters.config.base import Kind
from rdmaplane.core.settings.webhook import WebhookSettings

WEBHOOK_CONFIG: Final = Kind(
    "WebhookConfig",
    WebhookSettings,
    docs="docs/webhook.md",
    read_by="rdmaplane webhook --config and rdmaplane inject --config",
)
