"""kopf's webhook server with our certificates, and self-registration for `make run`."""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path

import kopf
from kubernetes.client.exceptions import ApiException

from tunefleet.builders.webhook import HANDLER_ID, build_webhook_configuration
from tunefleet.config import Config
from tunefleet.kube import Kube


def build(config: Config) -> kopf.WebhookServer:
    certfile, keyfile, cafile = config.webhook_certfile, config.webhook_keyfile, None
    if not (certfile and keyfile):
        from tunefleet.webhook import tls

        host = config.webhook_host or "127.0.0.1"
        ca, cert, key = tls.generate(Path(tempfile.mkdtemp(prefix="tunefleet-webhook-")), [host])
        certfile, keyfile, cafile = str(cert), str(key), str(ca)
    elif Path(certfile).with_name("ca.crt").exists():
        cafile = str(Path(certfile).with_name("ca.crt"))
    return kopf.WebhookServer(
        addr=config.webhook_addr,
        port=config.webhook_port,
        host=config.webhook_host or None,
        certfile=certfile,
        pkeyfile=keyfile,
        cafile=cafile,
    )


async def register_when_ready(
    client: Kube, server: kopf.WebhookServer, config: Config, logger: kopf.Logger
) -> None:
    """Create or replace the MutatingWebhookConfiguration that points at this process."""
    host = config.webhook_host or "127.0.0.1"
    url = f"https://{host}:{config.webhook_port}/{HANDLER_ID}"
    ca = Path(server.cafile).read_bytes() if server.cafile else b""
    body = build_webhook_configuration(
        config.webhook_register,
        {"url": url, "caBundle": base64.b64encode(ca).decode()},
        timeout_seconds=config.webhook_timeout_seconds,
        namespaces=config.namespaces,
    )
    admission = client.admission()
    try:
        admission.create_mutating_webhook_configuration(body)
    except ApiException as e:
        if e.status != 409:
            raise
        current = admission.read_mutating_webhook_configuration(config.webhook_register)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        admission.replace_mutating_webhook_configuration(config.webhook_register, body)
    logger.info(f"registered MutatingWebhookConfiguration {config.webhook_register} -> {url}")
