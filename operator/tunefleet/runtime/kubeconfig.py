"""An API connection for a command-line tool (the kubectl plugin, tunefleet-gc), found as kubectl
finds one: --kubeconfig, else $KUBECONFIG, else ~/.kube/config, and its context; in a pod
without one, the pod's ServiceAccount. Every failure is a KubeconfigError whose one line says
what to set."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import yaml

SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class KubeconfigError(Exception):
    """No usable kubeconfig; the message names the file and what to set."""


@dataclass(frozen=True)
class Connection:
    api: Any  # kubernetes.client.ApiClient
    namespace: str  # the context's namespace (the ServiceAccount's in a pod)
    host: str


def connect(kubeconfig: str | None, context: str | None) -> Connection:
    from kubernetes.config.config_exception import ConfigException

    path = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    config = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_kube_config(
            config_file=path, context=context, client_configuration=config, persist_config=False
        )
        contexts, current = kubernetes.config.list_kube_config_contexts(config_file=path)
        chosen = next(
            (c for c in contexts if c.get("name") == (context or (current or {}).get("name"))),
            current or {},
        )
        namespace = (chosen.get("context") or {}).get("namespace") or "default"
    except ConfigException as e:
        in_pod = os.environ.get("KUBERNETES_SERVICE_HOST") and SA_NAMESPACE.exists()
        if kubeconfig or context or not in_pod:
            raise KubeconfigError(
                f"cannot use kubeconfig {path}"
                + (f" (context {context})" if context else "")
                + f": {str(e).rstrip('.')}: set KUBECONFIG or pass --kubeconfig (and --context)"
            ) from None
        kubernetes.config.load_incluster_config(client_configuration=config)
        namespace = SA_NAMESPACE.read_text().strip() or "default"
    except (OSError, ValueError, TypeError, KeyError, yaml.YAMLError) as e:
        raise KubeconfigError(
            f"cannot read kubeconfig {path}: {str(e).rstrip('.')}: set KUBECONFIG or pass "
            "--kubeconfig"
        ) from None
    config.retries = 1  # urllib3's default retries 3 times: a down API server fails fast
    api = kubernetes.client.ApiClient(configuration=config)
    return Connection(api, namespace, str(config.host))
