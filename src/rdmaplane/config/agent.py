"""`AgentConfig`: the node agent's configuration file (`rdmaplane agent --config`,
docs/agent.md), read into `rdmaplane.agent.settings.AgentSettings`."""

from __future__ import annotations

from typing import Final

from rdmaplane.agent.settings import AgentSettings
from rdmaplane.config.base import Kind

AGENT_CONFIG: Final = Kind(
    "AgentConfig", AgentSettings, docs="docs/agent.md", read_by="rdmaplane agent --config"
)
