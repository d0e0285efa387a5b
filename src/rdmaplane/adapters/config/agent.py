"""`AgentConfig`: the node agent's configuration file (`rdmaplane agent --config`,
docs/agent.md), read into `rdmaplane.core.settings.agent.AgentSettings`."""

from __future__ import annotations

from typing import Final

from rdmaplane.adapters.config.base import Kind
from rdmaplane.core.settings.agent import AgentSettings

AGENT_CONFIG: Final = Kind(
    "AgentConfig", AgentSettings, docs="docs/agent.md", read_by="rdmaplane agent --config"
)
