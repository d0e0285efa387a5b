"""The `resources` section the extender's and the webhook's configs share: the cluster's
resource vocabulary (`rdmaplane.resources`), one name or a list per kind."""

from __future__ import annotations

from pydantic import Field, model_validator

from rdmaplane.config.base import Section
from rdmaplane.resources import DEFAULT, Vocabulary, VocabularyError

Names = str | list[str]


def _names(value: Names) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


class ResourcesConfig(Section):
    """The extended resource names of GPUs, exclusive HCA pools and shared pools; an NRT whose
    agent names its own (`rdmaplane.io/resources`) is read by those."""

    gpu: Names = Field(
        default=DEFAULT.gpus[0], description="GPUs: a name, or a list (one per GPU vendor)"
    )
    hca: Names = Field(
        default=DEFAULT.exclusive[0],
        description="exclusive HCA pools: a name or a list (the webhook adds the first)",
    )
    hca_shared: Names = Field(
        default=DEFAULT.shared[0],
        description="shared pools: a name or a list (the webhook adds the first)",
    )

    @model_validator(mode="after")
    def _valid(self) -> ResourcesConfig:
        for key, value in (("gpu", self.gpu), ("hca", self.hca), ("hcaShared", self.hca_shared)):
            if not _names(value):
                raise ValueError(f"{key}: name at least one resource")
        try:
            self.vocabulary()
        except VocabularyError as e:
            raise ValueError(str(e)) from None
        return self

    def vocabulary(self) -> Vocabulary:
        return Vocabulary(_names(self.gpu), _names(self.hca), _names(self.hca_shared))
