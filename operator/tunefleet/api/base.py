"""What every model of the TuningProfile API shares."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# The GPU model's node label key and the GPU resource, by vendor (spec.gpu may override both).
DEFAULT_LABEL_KEYS = {"amd": "amd.com/gpu.product-name", "nvidia": "nvidia.com/gpu.product"}
DEFAULT_RESOURCES = {"amd": "amd.com/gpu", "nvidia": "nvidia.com/gpu"}


class Model(BaseModel):
    # extra="forbid": a field the models don't know means the CRD and models drifted.
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )
