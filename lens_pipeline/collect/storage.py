"""Storage backends: StorageClasses and the Secrets they reference -> `storage` rows (spec §1.15, §4.7).

A table of drivers, one row per storage kind; JuiceFS is the one the original supported. A driver
says which provisioners are its own and how to name a backend from its StorageClass and Secret.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lens_pipeline.collect.problems import MalformedObject, mapping

Row = dict[str, Any]
SECRET_NAME = "csi.storage.k8s.io/provisioner-secret-name"
SECRET_NAMESPACE = "csi.storage.k8s.io/provisioner-secret-namespace"


def secret_value(secret: dict, key: str) -> str | None:
    """A Secret's data value, decoded; None when absent. The value never goes anywhere but the row."""
    data = mapping(secret, "data")
    raw = data.get(key)
    if raw is None:
        return None
    try:
        return base64.b64decode(str(raw), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise MalformedObject(f"Secret data[{key!r}] is not base64 text") from None


@dataclass(frozen=True)
class StorageDriver:
    kind: str
    provisioners: frozenset[str]
    backend_name: Callable[[dict, dict | None], str]  # (storage class, its secret or None) -> name


def _juicefs_name(storage_class: dict, secret: dict | None) -> str:
    if secret is None:
        raise MalformedObject("its provisioner Secret does not exist")
    name = secret_value(secret, "name")
    if not name:
        raise MalformedObject("its provisioner Secret has no data 'name' (the JuiceFS volume name)")
    return name


DRIVERS = (StorageDriver("juicefs", frozenset({"csi.juicefs.com", "juicedata.com"}), _juicefs_name),)


def driver_for(storage_class: dict) -> StorageDriver | None:
    provisioner = storage_class.get("provisioner")
    return next((d for d in DRIVERS if provisioner in d.provisioners), None)


def secret_ref(storage_class: dict) -> tuple[str, str] | None:
    """(namespace, name) of the provisioner Secret a StorageClass names, if any."""
    parameters = mapping(storage_class, "parameters")
    namespace, name = parameters.get(SECRET_NAMESPACE), parameters.get(SECRET_NAME)
    if isinstance(namespace, str) and isinstance(name, str) and namespace and name:
        return namespace, name
    return None


def storage_row(storage_class: dict, secret: dict | None) -> Row | None:
    """The `storage` row of a StorageClass, or None when no driver knows its provisioner."""
    driver = driver_for(storage_class)
    if driver is None:
        return None
    ref = secret_ref(storage_class)
    return {
        "kind": driver.kind,
        "name": driver.backend_name(storage_class, secret),
        "config": {
            "storage_class": mapping(storage_class, "metadata").get("name"),
            "meta_secret": {"namespace": ref[0], "name": ref[1]} if ref else None,
        },
        "source": "scan",
        # The original never probed health either; Prometheus' juicefs_* figures say more.
        "status": "unknown",
        "deleted_at": None,
    }
