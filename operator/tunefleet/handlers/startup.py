"""The one startup handler: kopf settings, API login, the webhook server."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from tunefleet import kube
from tunefleet.config import Config
from tunefleet.webhook import server as webhook_server


class _ConfigHolder:
    """Read once at startup; handlers get it without re-reading the environment."""

    def __init__(self) -> None:
        self._config: Config | None = None

    def set(self, config: Config) -> None:
        self._config = config

    def get(self) -> Config:
        if self._config is None:
            self._config = Config.from_env()
        return self._config


CONFIG = _ConfigHolder()


@kopf.on.startup()
async def operator_startup(settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> None:
    config = Config.from_env()
    CONFIG.set(config)
    # Our own keys, so kopf's bookkeeping on profiles is recognisable and never collides.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="tunefleet.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="tunefleet.io", key="last-handled-configuration"
    )
    settings.persistence.finalizer = "tunefleet.io/finalizer"
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 300
    settings.batching.error_delays = [1, 2, 5, 10, 30, 60]
    # Sync handlers call the blocking client; enough workers for many profiles at once.
    settings.execution.max_workers = 20
    kube.login()
    if config.webhook_enabled:
        settings.admission.server = webhook_server.build(config)
        if config.webhook_register:
            settings.admission.managed = None
            await webhook_server.register_when_ready(settings.admission.server, config, logger)
    logger.info(f"tunefleet operator started; tuning Jobs use image {config.image}")
