"""`metricscale certs`: the CA and serving certificate for the APIServices, created or renewed.

Files (under ``--dir``, default ``certs/``): ``ca.crt``/``ca.key``, ``serving.crt``/``serving.key``,
``ca-previous.crt`` after a CA rotation, and ``kustomization.yaml`` turning the serving pair into
the adapter's TLS Secret. Under ``--manifests`` it writes ``ca-bundle-patch.yaml``, the kustomize
patch that sets ``caBundle`` on every APIService. Keys are written mode 0600 and their names are
git-ignored. Re-running changes nothing until a certificate nears its expiry (``--renew-before``)
or the names asked for change.
"""

from __future__ import annotations

import argparse
import base64
import ipaddress
import logging
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from metricscale import pki
from metricscale.core.durations import DurationError, parse_lifetime
from metricscale.core.errors import ConfigError
from metricscale.files import FileError, parse_yaml, read_bytes, read_text

logger = logging.getLogger(__name__)

SECRET_NAME = "metricscale-serving-cert"
# The names manifests/ uses; change both together.
SERVICE_NAME = "metricscale-adapter"
CA_CERT = "ca.crt"
CA_KEY = "ca.key"
PREVIOUS_CA_CERT = "ca-previous.crt"
SERVING_CERT = "serving.crt"
SERVING_KEY = "serving.key"
SECRET_KUSTOMIZATION = "kustomization.yaml"
CA_BUNDLE_PATCH = "ca-bundle-patch.yaml"
# Validity starts this much before "now" so a peer whose clock lags a little still accepts it.
BACKDATE = timedelta(hours=1)

_DNS_NAME = re.compile(
    r"^(\*\.)?[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$")


class CertsError(ConfigError):
    """Something the operator must fix (a bad option, an unreadable key); the message says what."""

    heading = ""


def lifetime_argument(text: str) -> timedelta:
    """A lifetime flag's value (`30d`, `720h`, `1w2d`), as metricscale.core.durations reads it."""
    try:
        return parse_lifetime(text)
    except DurationError:
        raise CertsError(f"invalid duration {text!r}: use e.g. 30d, 720h or 1w2d") from None


@dataclass(frozen=True)
class ServingNames:
    common_name: str
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]


def serving_names(
    *, service: str, namespace: str, cluster_domain: str, sans: Sequence[str]
) -> ServingNames:
    """The names the aggregator dials (``<service>.<namespace>.svc``) plus the extra SANs."""
    service_host = f"{service}.{namespace}.svc"
    dns = [service_host, f"{service_host}.{cluster_domain}"]
    ips: list[str] = []
    for san in sans:
        value = san.strip()
        try:
            ips.append(str(ipaddress.ip_address(value)))
            continue
        except ValueError:
            pass
        name = value.lower()
        if not _DNS_NAME.match(name) or len(name) > 253:
            raise CertsError(f"--san {san!r} is neither an IP address nor a DNS name")
        dns.append(name)
    for name in dns[:2]:
        if not _DNS_NAME.match(name):
            raise CertsError(f"{name!r} is not a valid DNS name: check --service, --namespace "
                             "and --cluster-domain")
    return ServingNames(common_name=service_host, dns_names=tuple(dict.fromkeys(dns)),
                        ip_addresses=tuple(dict.fromkeys(ips)))


# --------------------------------------------------------------------------------------------
# What to (re)create: a pure decision over the certificates on disk


@dataclass(frozen=True)
class Plan:
    new_ca: bool
    new_serving: bool
    reasons: tuple[str, ...]


def _expires_soon(certificate: x509.Certificate, *, now: datetime, renew_before: timedelta) -> bool:
    return certificate.not_valid_after_utc - now <= renew_before


def _names_of(certificate: x509.Certificate) -> tuple[set[str], set[str]]:
    try:
        sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set(), set()
    return (set(sans.get_values_for_type(x509.DNSName)),
            {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)})


def earlier_sans(certificate: x509.Certificate) -> tuple[str, ...]:
    """The extra names of an earlier serving certificate: its SANs but its own service host."""
    common_names = certificate.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    service_host = str(common_names[0].value) if common_names else ""
    dns, ips = _names_of(certificate)
    extra = sorted(name for name in dns
                   if name != service_host and not name.startswith(service_host + "."))
    return (*extra, *sorted(ips))


def _normal_ip(text: str) -> str | None:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def kept_sans(*, earlier: Sequence[str], asked: Sequence[str],
              dropped: Sequence[str]) -> tuple[str, ...]:
    """The extra names of the next certificate: the earlier ones, unless dropped, then the asked.

    A rerun without an earlier `--san` must not silently take that name away from clients.
    """
    drop = {name.strip().lower() for name in dropped}
    drop_ips = {_normal_ip(name) for name in drop} - {None}
    kept = [name for name in earlier if name.lower() not in drop and name not in drop_ips]
    return tuple(dict.fromkeys((*kept, *asked)))


def _signed_by(certificate: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        certificate.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def plan_certificates(
    *,
    ca: x509.Certificate | None,
    serving: x509.Certificate | None,
    names: ServingNames,
    now: datetime,
    renew_before: timedelta,
    force: bool = False,
) -> Plan:
    """Which of the CA and the serving certificate must be made anew, and why."""
    reasons: list[str] = []
    new_ca = False
    if ca is None:
        new_ca, reasons = True, ["no usable CA"]
    elif _expires_soon(ca, now=now, renew_before=renew_before):
        new_ca, reasons = True, [f"the CA expires {ca.not_valid_after_utc:%Y-%m-%d}"]
    if new_ca or force:
        if force:
            reasons.append("--force")
        return Plan(new_ca=new_ca, new_serving=True, reasons=tuple(reasons))
    assert ca is not None
    if serving is None:
        reasons.append("no usable serving certificate")
    elif _expires_soon(serving, now=now, renew_before=renew_before):
        reasons.append(f"the serving certificate expires {serving.not_valid_after_utc:%Y-%m-%d}")
    elif _names_of(serving) != (set(names.dns_names), set(names.ip_addresses)):
        reasons.append("the serving certificate's names differ from those asked for")
    elif not _signed_by(serving, ca):
        reasons.append("the serving certificate was not signed by the current CA")
    return Plan(new_ca=False, new_serving=bool(reasons), reasons=tuple(reasons))


# --------------------------------------------------------------------------------------------
# Generated kustomize inputs


def ca_bundle_patch(ca_certificates: Sequence[x509.Certificate]) -> str:
    """The JSON6902 patch (YAML) setting ``caBundle`` to the base64 of the PEM bundle."""
    bundle = b"".join(pki.certificate_pem(certificate) for certificate in ca_certificates)
    encoded = base64.b64encode(bundle).decode()
    return (
        "# Generated by `metricscale certs`: the CA bundle that verifies the adapter's serving\n"
        "# certificate. kustomization.yaml applies it to every APIService. Do not edit; re-run\n"
        "# `metricscale certs` instead.\n"
        "- op: add\n"
        "  path: /spec/caBundle\n"
        f"  value: {encoded}\n"
    )


def secret_kustomization(*, namespace: str) -> str:
    """A kustomization turning the serving pair into the TLS Secret the adapter mounts."""
    return (
        "# Generated by `metricscale certs`: the adapter's serving certificate as a TLS Secret.\n"
        "# Referenced from manifests/kustomization.yaml. The name is fixed (no hash suffix): the\n"
        "# adapter reloads a renewed certificate from the mounted files without a restart.\n"
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        "generatorOptions:\n"
        "  disableNameSuffixHash: true\n"
        "secretGenerator:\n"
        f"  - name: {SECRET_NAME}\n"
        f"    namespace: {namespace}\n"
        "    type: kubernetes.io/tls\n"
        "    files:\n"
        f"      - tls.crt={SERVING_CERT}\n"
        f"      - tls.key={SERVING_KEY}\n"
    )


# --------------------------------------------------------------------------------------------
# The command


@dataclass(frozen=True)
class CertsOptions:
    directory: Path
    manifests: Path | None
    service: str = SERVICE_NAME
    namespace: str = "metricscale"
    cluster_domain: str = "cluster.local"
    sans: tuple[str, ...] = ()
    drop_sans: tuple[str, ...] = ()
    renew_before: timedelta = timedelta(days=30)
    ca_validity: timedelta = timedelta(days=3650)
    validity: timedelta = timedelta(days=365)
    force: bool = False


def _load_pair(cert_path: Path, key_path: Path) -> pki.CertifiedKey | None:
    """A certificate and its key from disk, or None when missing or not a matching pair."""
    if not cert_path.is_file() or not key_path.is_file():
        return None
    try:
        certificate = pki.load_certificate_pem(_read_pem(cert_path))
        key = pki.load_private_key_pem(_read_pem(key_path))
    except pki.PKIError as error:
        logger.warning("ignoring %s: %s", cert_path, error)
        return None
    if certificate.public_key() != key.public_key():
        logger.warning("ignoring %s: it does not match %s", cert_path, key_path)
        return None
    return pki.CertifiedKey(certificate=certificate, private_key=key)


def _read_pem(path: Path) -> bytes:
    """A PEM file of --dir, bounded (/dev/zero or a misplaced file is refused, not read)."""
    try:
        return read_bytes(str(path))
    except FileError as error:
        raise CertsError(str(error)) from None


def _write_text_if_changed(path: Path, text: str) -> bool:
    if path.is_file():
        try:
            if read_text(str(path)) == text:
                return False
        except FileError:
            pass  # unreadable as text: written anew
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return True


def _still_valid(path: Path, *, now: datetime) -> x509.Certificate | None:
    if not path.is_file():
        return None
    try:
        certificate = pki.load_certificate_pem(_read_pem(path))
    except pki.PKIError:
        return None
    return certificate if certificate.not_valid_after_utc > now else None


def ensure_certificates(options: CertsOptions, *, now: datetime) -> list[str]:
    """Create or renew what is needed; return one human line per thing done or kept."""
    if options.renew_before >= options.validity:
        raise CertsError("--renew-before must be shorter than --validity, or every run renews")
    _check_manifests_use(options)
    directory = options.directory
    ca = _load_pair(directory / CA_CERT, directory / CA_KEY)
    serving = _load_pair(directory / SERVING_CERT, directory / SERVING_KEY)
    earlier = earlier_sans(serving.certificate) if serving is not None else ()
    sans = kept_sans(earlier=earlier, asked=options.sans, dropped=options.drop_sans)
    names = serving_names(service=options.service, namespace=options.namespace,
                          cluster_domain=options.cluster_domain, sans=sans)
    plan = plan_certificates(
        ca=ca.certificate if ca else None, serving=serving.certificate if serving else None,
        names=names, now=now, renew_before=options.renew_before, force=options.force)
    lines: list[str] = []
    start = now - BACKDATE

    if plan.new_ca:
        if ca is not None:
            # Keep trusting the old CA for a while: the caBundle and the Secret reach the
            # cluster at different moments, and neither side should see a mismatch meanwhile.
            pki.write_certificate(directory / PREVIOUS_CA_CERT, ca.certificate)
        ca = pki.generate_ca(common_name=f"metricscale-ca@{int(now.timestamp())}", now=start,
                             validity=options.ca_validity + BACKDATE)
        pki.write_private_key(directory / CA_KEY, ca.private_key)
        pki.write_certificate(directory / CA_CERT, ca.certificate)
        lines.append(f"created CA {directory / CA_CERT} "
                     f"(until {ca.certificate.not_valid_after_utc:%Y-%m-%d}; "
                     f"{', '.join(plan.reasons)})")
    assert ca is not None
    if plan.new_serving:
        serving = pki.issue_serving_certificate(
            ca, common_name=names.common_name, dns_names=names.dns_names,
            ip_addresses=names.ip_addresses, now=start, validity=options.validity + BACKDATE)
        pki.write_private_key(directory / SERVING_KEY, serving.private_key)
        pki.write_certificate(directory / SERVING_CERT, serving.certificate)
        lines.append(f"issued serving certificate {directory / SERVING_CERT} for "
                     f"{', '.join((*names.dns_names, *names.ip_addresses))} "
                     f"(until {serving.certificate.not_valid_after_utc:%Y-%m-%d}; "
                     f"{', '.join(plan.reasons)})")
        carried = [name for name in earlier if name in sans and name not in options.sans]
        if carried:
            lines.append(f"kept earlier SAN(s) {', '.join(carried)} "
                         "(drop one with --drop-san NAME)")
    else:
        assert serving is not None
        lines.append(f"kept serving certificate {directory / SERVING_CERT} "
                     f"(until {serving.certificate.not_valid_after_utc:%Y-%m-%d})")
        carried = [name for name in earlier if name not in options.sans]
        if carried:
            lines.append(f"kept earlier SAN(s) {', '.join(carried)} "
                         "(drop one with --drop-san NAME)")

    if _write_text_if_changed(directory / SECRET_KUSTOMIZATION,
                              secret_kustomization(namespace=options.namespace)):
        lines.append(f"wrote {directory / SECRET_KUSTOMIZATION}")
    if options.manifests is not None:
        trusted = [ca.certificate]
        previous = _still_valid(directory / PREVIOUS_CA_CERT, now=now)
        if previous is not None and previous != ca.certificate:
            trusted.append(previous)
        patch = options.manifests / CA_BUNDLE_PATCH
        if _write_text_if_changed(patch, ca_bundle_patch(trusted)):
            lines.append(f"wrote {patch} (caBundle for the APIServices)")
    if plan.new_serving:
        if options.manifests is not None and options.manifests.name == "certs-files":
            lines.append(f"list components/{options.manifests.name} in "
                         f"{options.manifests.parent.parent / 'kustomization.yaml'}, then "
                         f"apply with: kubectl apply -k {options.manifests.parent.parent}")
        elif options.manifests is None or (options.manifests / "kustomization.yaml").exists():
            lines.append("apply with: kubectl apply -k " + str(options.manifests or "manifests"))
        else:
            lines.append(f"reference {options.manifests / CA_BUNDLE_PATCH} from your "
                         "kustomization's patches (it sets the APIServices' caBundle), then "
                         "apply it with kubectl apply -k")
    return lines


def _certs_directory_of(kustomize_dir: Path) -> Path | None:
    """The certs directory a kustomization (or component) lists among its resources, if any."""
    path = str(kustomize_dir / "kustomization.yaml")
    try:
        listed = parse_yaml(read_text(path), path)
    except FileError:
        return None  # not ours to judge: kustomize reports what is wrong with it
    resources = listed.get("resources") if isinstance(listed, dict) else None
    for entry in resources if isinstance(resources, list) else []:
        if isinstance(entry, str) and Path(entry).name == "certs":
            return (kustomize_dir / entry).resolve()
    return None


def _check_manifests_use(options: CertsOptions) -> None:
    """Refuse to write a caBundle patch for a kustomization that serves another directory's
    certificate: the APIServices would trust a CA that did not sign what the adapter serves,
    and every metrics request would fail TLS verification."""
    if options.manifests is None:
        return
    served = _certs_directory_of(options.manifests)
    if served is None or options.directory.resolve() == served:
        return
    raise CertsError(
        f"--dir {options.directory}: {options.manifests / 'kustomization.yaml'} serves the "
        f"certificate in {served}, so its caBundle patch must hold that CA, not this one; "
        f"give --dir {served}, or --no-manifests to only write the files (or --manifests "
        "for a kustomization of your own that takes them from here)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, default=Path("certs"),
                        help="where the PEM files go (default: certs)")
    parser.add_argument("--manifests", type=Path,
                        default=Path("manifests/components/certs-files"),
                        help="kustomize directory that receives ca-bundle-patch.yaml "
                             "(default: manifests/components/certs-files, the component that "
                             "uses these files)")
    parser.add_argument("--no-manifests", action="store_true",
                        help="do not write the caBundle patch")
    parser.add_argument("--service", default=SERVICE_NAME,
                        help=f"the adapter's Service name (default: {SERVICE_NAME})")
    parser.add_argument("--namespace", default="metricscale",
                        help="the adapter's namespace (default: metricscale)")
    parser.add_argument("--cluster-domain", default="cluster.local",
                        help="the cluster's DNS domain (default: cluster.local)")
    parser.add_argument("--san", action="append", default=[],
                        help="extra DNS name or IP address for the serving certificate "
                             "(repeatable)")
    parser.add_argument("--drop-san", action="append", default=[], metavar="NAME",
                        help="remove an extra DNS name or IP address an earlier run added "
                             "(repeatable; without it every earlier --san is kept)")
    parser.add_argument("--renew-before", default="30d",
                        help="renew a certificate expiring within this (default: 30d)")
    parser.add_argument("--validity", default="365d",
                        help="serving certificate lifetime (default: 365d)")
    parser.add_argument("--ca-validity", default="3650d",
                        help="CA lifetime (default: 3650d)")
    parser.add_argument("--force", action="store_true",
                        help="issue a new serving certificate even if the current one is fine")


def options_from_args(args: argparse.Namespace) -> CertsOptions:
    return CertsOptions(
        directory=args.dir,
        manifests=None if args.no_manifests else args.manifests,
        service=args.service,
        namespace=args.namespace,
        cluster_domain=args.cluster_domain,
        sans=tuple(args.san),
        drop_sans=tuple(args.drop_san),
        renew_before=lifetime_argument(args.renew_before),
        ca_validity=lifetime_argument(args.ca_validity),
        validity=lifetime_argument(args.validity),
        force=args.force,
    )


def run(args: argparse.Namespace) -> int:
    """Create or renew the files; what the operator must fix raises CertsError: one line,
    exit 2 (cli/main.py)."""
    try:
        lines = ensure_certificates(options_from_args(args), now=datetime.now(UTC))
    except pki.PKIError as error:
        raise CertsError(str(error)) from None
    except OSError as error:
        print(f"metricscale certs: {error}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0
