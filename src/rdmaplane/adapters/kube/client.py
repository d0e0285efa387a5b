"""lightkube clients from a kubeconfig file or, inside a pod, the mounted service account.

Every component takes an optional kubeconfig path: tests and out-of-cluster runs pass one,
DaemonSets and Deployments pass none and use their service account.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import httpx2  # lightkube's transport; its errors are what an unreachable server raises
from lightkube import ApiError, AsyncClient, Client, ConfigError, KubeConfig

from rdmaplane.adapters.documents import DocumentError, expect_mapping, read_document
from rdmaplane.core.errors import InputError

FIELD_MANAGER = "rdmaplane"
# What one request to the API server may raise: a refusal, or the server out of reach.
API_ERRORS = (ApiError, httpx2.HTTPError, OSError, TimeoutError)


class KubeconfigError(InputError):
    """No usable kubeconfig: the file is missing or is not one, or none was given outside a
    pod; the message names it."""


def load_config(kubeconfig: Path | None = None) -> KubeConfig:
    """The kubeconfig at `kubeconfig`, else the in-cluster service account.

    Raises `KubeconfigError` naming the file or the missing service account.
    """
    if kubeconfig is not None:
        if not kubeconfig.exists():
            raise KubeconfigError(f"kubeconfig {kubeconfig} does not exist")
        return _from_file(kubeconfig)
    try:
        return KubeConfig.from_service_account()
    except ConfigError as err:
        raise KubeconfigError(
            f"no kubeconfig given and not running in a pod with a service account ({err})"
        ) from err


def _from_file(path: Path) -> KubeConfig:
    """The kubeconfig at `path`, read like every other document (binary junk, deep nesting and
    syntax errors answered in one line); lightkube's own reader would raise whatever its parser
    meets on a file that is not a kubeconfig, so that becomes a `KubeconfigError` naming it
    too."""
    try:
        doc = expect_mapping(read_document(path), str(path), "a kubeconfig")
    except DocumentError as e:
        raise KubeconfigError(str(e)) from None
    try:
        return KubeConfig.from_dict(doc, fname=path)
    except KeyError as e:
        raise KubeconfigError(f"{path}: not a kubeconfig: no {e}") from None
    except (TypeError, AttributeError, ValueError, ConfigError) as e:
        raise KubeconfigError(f"{path}: not a kubeconfig: {e}") from None


def sync_client(kubeconfig: Path | None = None, field_manager: str = FIELD_MANAGER) -> Client:
    """A blocking client, for the CLI and tests."""
    return _client(Client, kubeconfig, field_manager)


def async_client(kubeconfig: Path | None = None, field_manager: str = FIELD_MANAGER) -> AsyncClient:
    """An asyncio client, for the services."""
    return _client(AsyncClient, kubeconfig, field_manager)


C = TypeVar("C", Client, AsyncClient)


def _client(kind: type[C], kubeconfig: Path | None, field_manager: str) -> C:
    config = load_config(kubeconfig)
    try:
        return kind(config, field_manager=field_manager, trust_env=False)
    except ConfigError as e:  # a context lightkube cannot use
        raise KubeconfigError(str(e)) from None
