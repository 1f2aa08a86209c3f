"""The kinds of a project's third-party keys (services/accounts/project_keys.py), as trainML names them: what
each opens. A registry key's name is its registry's host; any other kind's is a label."""

from __future__ import annotations

from enum import StrEnum


class KeyKind(StrEnum):
    REGISTRY = "registry"  # a container registry's username and password (or token), for `podman pull`
    AWS = "aws"  # an access key id and its secret: s3:// sources and outputs
    GCP = "gcp"  # a service account's JSON key (the key id is its client email): gs://
    AZURE = "azure"  # a storage account's name and key: azure://
    HUGGINGFACE = "huggingface"
    KAGGLE = "kaggle"
    WANDB = "wandb"


DEFAULT_NAME = "default"  # the label of a non-registry key that is not given one
