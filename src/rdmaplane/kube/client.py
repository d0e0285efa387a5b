"""lightkube clients from a kubeconfig file or, inside a pod, the mounted service account.

Every component takes an optional kubeconfig path: tests and out-of-cluster runs pass one,
DaemonSets and Deployments pass none and use their service account.
"""

from __future__ import annotations

from pathlib import Path

import httpx2  # lightkube's transport; its errors are what an unreachable server raises
from lightkube import ApiError, AsyncClient, Client, ConfigError, KubeConfig

from rdmaplane.documents import DocumentError, expect_mapping, read_document

FIELD_MANAGER = "rdmaplane"
# What one request to the API server may raise: a refusal, or the server out of reach.
API_ERRORS = (ApiError, httpx2.HTTPError, OSError, TimeoutError)


def load_config(kubeconfig: Path | None = None) -> KubeConfig:
    """The kubeconfig at `kubeconfig`, else the in-cluster service account.

    Raises `ConfigError` naming the file or the missing service account.
    """
    if kubeconfig is not None:
        if not kubeconfig.exists():
            raise ConfigError(f"kubeconfig {kubeconfig} does not exist")
        return _from_file(kubeconfig)
    try:
        return KubeConfig.from_service_account()
    except ConfigError as err:
        raise ConfigError(
            f"no kubeconfig given and not running in a pod with a service account ({err})"
        ) from err


def _from_file(path: Path) -> KubeConfig:
    """The kubeconfig at `path`, read like every other document (binary junk, deep nesting and
    syntax errors answered in one line); lightkube's own reader would raise whatever its parser
    meets on a file that is not a kubeconfig, so that becomes a `ConfigError` naming it too."""
    try:
        doc = expect_mapping(read_document(path), str(path), "a kubeconfig")
    except DocumentError as e:
        raise ConfigError(str(e)) from None
    try:
        return KubeConfig.from_dict(doc, fname=path)
    except KeyError as e:
        raise ConfigError(f"{path}: not a kubeconfig: no {e}") from None
    except (TypeError, AttributeError, ValueError) as e:
        raise ConfigError(f"{path}: not a kubeconfig: {e}") from None


def sync_client(kubeconfig: Path | None = None, field_manager: str = FIELD_MANAGER) -> Client:
    """A blocking client, for the CLI and tests."""
    return Client(load_config(kubeconfig), field_manager=field_manager, trust_env=False)


def async_client(kubeconfig: Path | None = None, field_manager: str = FIELD_MANAGER) -> AsyncClient:
    """An asyncio client, for the services."""
    return AsyncClient(load_config(kubeconfig), field_manager=field_manager, trust_env=False)
