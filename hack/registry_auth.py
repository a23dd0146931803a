"""cluster-up's OCI registry identities: the htpasswd file (bcrypt, as Distribution requires)
and, per identity, a directory laid out as a kubernetes.io/dockerconfigjson Secret is mounted
(.dockerconfigjson; config.json for tools that read $DOCKER_CONFIG; ca.crt).

    registry_auth.py STATE_OCI_DIR HOST:PORT CA_FILE

Passwords are read from STATE_OCI_DIR/{writer,reader}.password (cluster-up makes them).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import sys

import bcrypt

USERS = {"writer": "tunefleet", "reader": "tunefleet-reader"}


def _write_private(path: str, text: str) -> None:
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(text)


def main(directory: str, host: str, ca: str) -> None:
    lines = []
    for who, user in USERS.items():
        with open(os.path.join(directory, f"{who}.password")) as f:
            password = f.read().strip()
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()
        lines.append(f"{user}:{hashed}")
        auth = base64.b64encode(f"{user}:{password}".encode()).decode()
        config = json.dumps({"auths": {host: {"auth": auth}}})
        os.makedirs(os.path.join(directory, who), exist_ok=True)
        for name in (".dockerconfigjson", "config.json"):
            _write_private(os.path.join(directory, who, name), config)
        shutil.copyfile(ca, os.path.join(directory, who, "ca.crt"))
    _write_private(os.path.join(directory, "htpasswd"), "\n".join(lines) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:4])
