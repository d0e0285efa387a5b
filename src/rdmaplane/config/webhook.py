"""`WebhookConfig`: what `rdmaplane webhook` adds to GPU pods and where its serving certificate
comes from (`rdmaplane webhook --config`, `rdmaplane inject --config`; docs/webhook.md), read
into `rdmaplane.webhook.settings.WebhookSettings`."""

from __future__ import annotations

from typing import Final

from rdmaplane.config.base import Kind
from rdmaplane.webhook.settings import WebhookSettings

WEBHOOK_CONFIG: Final = Kind(
    "WebhookConfig",
    WebhookSettings,
    docs="docs/webhook.md",
    read_by="rdmaplane webhook --config and rdmaplane inject --config",
)
