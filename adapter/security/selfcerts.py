"""Self-managed serving certificates: a CA and a serving pair kept in a Secret, and caBundles.

When no --tls-cert-file is mounted, the adapter keeps its own CA and serving certificate in one
Secret of its namespace (so replicas share them and a restart keeps them), writes the pair into
--cert-dir for `ReloadingServerContext` to pick up, and writes the CA into the `caBundle` of its
own APIServices, named one by one so the RBAC can be restricted by resourceNames.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote

from cryptography import x509

from metricscale import pki
from metricscale.kube.errors import (
    Conflict,
    ErrorContext,
    Forbidden,
    KubeError,
    error_from_response,
)
from metricscale.kube.http import JSON, KubeHTTP, Response

__all__ = [
    "CA_CERT_KEY", "CA_KEY_KEY", "CertBundle", "PermissionMissing", "SelfCertsConfig",
    "SelfManagedCertificates", "needs_renewal", "serving_dns_names",
]

logger = logging.getLogger(__name__)

CA_CERT_KEY = "ca.crt"
CA_KEY_KEY = "ca.key"
TLS_CERT_KEY = "tls.crt"
TLS_KEY_KEY = "tls.key"
SERVING_CERT_NAME = "serving.crt"
SERVING_KEY_NAME = "serving.key"
_BACKDATE = timedelta(hours=1)
_MERGE_PATCH = "application/merge-patch+json"
_APIREGISTRATION = "apiregistration.k8s.io"


class PermissionMissing(KubeError):
    """The API server refused one request of the certificate management (403)."""


@dataclass(frozen=True)
class SelfCertsConfig:
    """Where the certificates live and which APIServices trust them."""

    namespace: str
    secret_name: str
    service_name: str
    cert_dir: Path
    apiservices: tuple[str, ...]
    optional_apiservices: tuple[str, ...] = ()
    ca_validity: timedelta = timedelta(days=3650)
    serving_validity: timedelta = timedelta(days=365)


@dataclass(frozen=True)
class CertBundle:
    """The Secret's content, parsed: CA and serving pair (PEM), and its resourceVersion."""

    ca_pem: bytes
    ca_key_pem: bytes
    cert_pem: bytes
    key_pem: bytes
    resource_version: str = ""

    @property
    def serving_certificate(self) -> x509.Certificate:
        return pki.load_certificate_pem(self.cert_pem)


# --------------------------------------------------------------------------------------------
# Decisions (pure)


def serving_dns_names(service: str, namespace: str) -> tuple[str, ...]:
    """The names the aggregator (ServerName `<service>.<namespace>.svc`) and others may use."""
    return (service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local")


def needs_renewal(certificate: x509.Certificate, *, now: datetime) -> bool:
    """True when less than a third of the certificate's life is left."""
    start, end = certificate.not_valid_before_utc, certificate.not_valid_after_utc
    return (end - now) < (end - start) / 3


def _issue_serving(ca: pki.CertifiedKey, config: SelfCertsConfig, *,
                   now: datetime) -> pki.CertifiedKey:
    return pki.issue_serving_certificate(
        ca, common_name=f"{config.service_name}.{config.namespace}.svc",
        dns_names=serving_dns_names(config.service_name, config.namespace),
        now=now - _BACKDATE, validity=config.serving_validity + _BACKDATE)


def new_bundle(config: SelfCertsConfig, *, now: datetime) -> CertBundle:
    """A fresh CA and a serving pair it signed."""
    ca = pki.generate_ca(common_name=f"metricscale-adapter-ca@{int(now.timestamp())}",
                         now=now - _BACKDATE, validity=config.ca_validity + _BACKDATE)
    serving = _issue_serving(ca, config, now=now)
    return CertBundle(ca_pem=pki.certificate_pem(ca.certificate),
                      ca_key_pem=pki.private_key_pem(ca.private_key),
                      cert_pem=pki.certificate_pem(serving.certificate),
                      key_pem=pki.private_key_pem(serving.private_key))


def renewed_bundle(bundle: CertBundle, config: SelfCertsConfig, *, now: datetime) -> CertBundle:
    """The same CA with a new serving pair (the caBundles stay valid)."""
    ca = pki.CertifiedKey(certificate=pki.load_certificate_pem(bundle.ca_pem),
                          private_key=pki.load_private_key_pem(bundle.ca_key_pem))
    serving = _issue_serving(ca, config, now=now)
    return CertBundle(ca_pem=bundle.ca_pem, ca_key_pem=bundle.ca_key_pem,
                      cert_pem=pki.certificate_pem(serving.certificate),
                      key_pem=pki.private_key_pem(serving.private_key),
                      resource_version=bundle.resource_version)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def secret_body(bundle: CertBundle, config: SelfCertsConfig) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": config.secret_name, "namespace": config.namespace,
        "labels": {"app.kubernetes.io/name": "metricscale-adapter",
                   "app.kubernetes.io/component": "serving-certificates"}}
    if bundle.resource_version:
        metadata["resourceVersion"] = bundle.resource_version
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata,
            "type": "kubernetes.io/tls",
            "data": {TLS_CERT_KEY: _b64(bundle.cert_pem), TLS_KEY_KEY: _b64(bundle.key_pem),
                     CA_CERT_KEY: _b64(bundle.ca_pem), CA_KEY_KEY: _b64(bundle.ca_key_pem)}}


def bundle_from_secret(secret: dict[str, Any]) -> CertBundle | None:
    """The bundle a Secret holds; None when a key is missing or does not parse."""
    data = secret.get("data") or {}
    try:
        values = {key: base64.b64decode(data[key], validate=True)
                  for key in (TLS_CERT_KEY, TLS_KEY_KEY, CA_CERT_KEY, CA_KEY_KEY)}
        pki.load_certificate_pem(values[TLS_CERT_KEY])
        pki.load_certificate_pem(values[CA_CERT_KEY])
        pki.load_private_key_pem(values[CA_KEY_KEY])
    except (KeyError, ValueError, TypeError):
        return None
    return CertBundle(ca_pem=values[CA_CERT_KEY], ca_key_pem=values[CA_KEY_KEY],
                      cert_pem=values[TLS_CERT_KEY], key_pem=values[TLS_KEY_KEY],
                      resource_version=str((secret.get("metadata") or {})
                                           .get("resourceVersion") or ""))


# --------------------------------------------------------------------------------------------
# Files


def _write_atomically(path: Path, data: bytes, *, mode: int) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)


def serving_paths(cert_dir: Path) -> tuple[Path, Path]:
    return cert_dir / SERVING_CERT_NAME, cert_dir / SERVING_KEY_NAME


def write_serving_files(bundle: CertBundle, cert_dir: Path) -> tuple[Path, Path]:
    """The pair into --cert-dir; unchanged files are not rewritten. The key goes first: a
    reload that catches the two out of step fails and keeps the previous context."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = serving_paths(cert_dir)
    chain = bundle.cert_pem + bundle.ca_pem
    for path, data, mode in ((key_path, bundle.key_pem, 0o600), (cert_path, chain, 0o644)):
        if not path.is_file() or path.read_bytes() != data:
            _write_atomically(path, data, mode=mode)
    return cert_path, key_path


# --------------------------------------------------------------------------------------------
# Kubernetes I/O


class SelfManagedCertificates:
    """Get-or-create the Secret, keep the files and caBundles in step, renew before expiry."""

    def __init__(self, http: KubeHTTP, config: SelfCertsConfig) -> None:
        self._http = http
        self._config = config
        self.bundle: CertBundle | None = None
        self._patched_ca: bytes | None = None

    @property
    def _secret_path(self) -> str:
        return (f"/api/v1/namespaces/{quote(self._config.namespace, safe='')}/secrets")

    def _raise(self, response: Response, *, verb: str, resource: str, name: str,
               namespaced: bool, role: str) -> NoReturn:
        error = error_from_response(
            response.status, headers=response.headers, body=response.body, verb=verb,
            context=ErrorContext(resource=resource, name=name))
        if isinstance(error, Forbidden):
            where = f" in namespace {self._config.namespace!r}" if namespaced else ""
            raise PermissionMissing(
                f"the adapter may not {verb} {resource} \"{name}\"{where}: grant it in the "
                f"adapter's {role} ({error})", status=403, reason="Forbidden") from error
        raise error

    async def _read_secret(self) -> CertBundle | None:
        name = self._config.secret_name
        response = await self._http.request(
            "GET", f"{self._secret_path}/{quote(name, safe='')}")
        if response.status == 404:
            return None
        if response.status != 200:
            self._raise(response, verb="get", resource="secrets", name=name, namespaced=True,
                        role="Role")
        return bundle_from_secret(json.loads(response.body))

    async def _create_secret(self, bundle: CertBundle) -> CertBundle | None:
        """Create it; None when another replica created it first (409 AlreadyExists)."""
        response = await self._http.request(
            "POST", self._secret_path, body=secret_body(bundle, self._config), content_type=JSON)
        if response.status == 409:
            return None
        if response.status not in (200, 201):
            self._raise(response, verb="create", resource="secrets",
                        name=self._config.secret_name, namespaced=True, role="Role")
        created = bundle_from_secret(json.loads(response.body))
        assert created is not None
        logger.info("created the certificate Secret %s/%s", self._config.namespace,
                    self._config.secret_name)
        return created

    async def _update_secret(self, bundle: CertBundle) -> CertBundle | None:
        """Replace it at the resourceVersion read; None when someone changed it since (409)."""
        name = self._config.secret_name
        response = await self._http.request(
            "PUT", f"{self._secret_path}/{quote(name, safe='')}",
            body=secret_body(bundle, self._config), content_type=JSON)
        if response.status == 409:
            return None
        if response.status != 200:
            self._raise(response, verb="update", resource="secrets", name=name,
                        namespaced=True, role="Role")
        updated = bundle_from_secret(json.loads(response.body))
        assert updated is not None
        return updated

    async def _get_or_create(self, *, now: datetime) -> CertBundle:
        for _ in range(5):
            current = await self._read_secret()
            if current is None:
                created = await self._create_secret(new_bundle(self._config, now=now))
                if created is not None:
                    return created
                continue  # another replica won: read theirs
            return current
        raise Conflict("the certificate Secret keeps changing; giving up for now",
                       status=409, reason="Conflict")

    async def _patch_ca_bundles(self, ca_pem: bytes) -> None:
        body = {"spec": {"caBundle": _b64(ca_pem)}}
        optional = set(self._config.optional_apiservices)
        for name in (*self._config.apiservices, *self._config.optional_apiservices):
            path = f"/apis/{_APIREGISTRATION}/v1/apiservices/{quote(name, safe='')}"
            response = await self._http.request("PATCH", path, body=body,
                                                content_type=_MERGE_PATCH)
            if response.status == 404 and name in optional:
                continue
            if response.status != 200:
                self._raise(response, verb="patch", resource=f"apiservices.{_APIREGISTRATION}",
                            name=name, namespaced=False, role="ClusterRole")
            logger.info("caBundle of APIService %s set", name)

    async def reconcile_once(self, *, now: datetime) -> CertBundle:
        """One step: read (or create) the Secret, renew if due, write files and caBundles."""
        bundle = await self._get_or_create(now=now)
        for _ in range(5):
            if not needs_renewal(bundle.serving_certificate, now=now):
                break
            updated = await self._update_secret(renewed_bundle(bundle, self._config, now=now))
            if updated is not None:
                logger.info("renewed the serving certificate in Secret %s/%s",
                            self._config.namespace, self._config.secret_name)
                bundle = updated
                break
            bundle = await self._get_or_create(now=now)  # another replica renewed first
        write_serving_files(bundle, self._config.cert_dir)
        if bundle.ca_pem != self._patched_ca:
            await self._patch_ca_bundles(bundle.ca_pem)
            self._patched_ca = bundle.ca_pem
        self.bundle = bundle
        return bundle

    def files(self) -> tuple[Path, Path]:
        return serving_paths(self._config.cert_dir)


def default_apiservices() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(required, optional-if-present) APIService names the adapter serves."""
    return (("v1beta1.custom.metrics.k8s.io", "v1beta2.custom.metrics.k8s.io",
             "v1beta1.external.metrics.k8s.io"), ("v1beta1.metrics.k8s.io",))

