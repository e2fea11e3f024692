"""`metricscale certs`: files, modes, names, renewal near expiry, caBundle patch, idempotence."""

from __future__ import annotations

import base64
import ssl
import stat
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from cli import main as cli
from cli.certs import (
    CertsError,
    CertsOptions,
    ensure_certificates,
    lifetime_argument,
    plan_certificates,
    serving_names,
)
from metricscale import pki
from testbed.fakes.tools import require_tool

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 3, 1, tzinfo=UTC)


def options(tmp_path: Path, **changes: object) -> CertsOptions:
    base = CertsOptions(directory=tmp_path / "certs", manifests=tmp_path / "manifests")
    return CertsOptions(**{**base.__dict__, **changes})  # type: ignore[arg-type]


def load(path: Path) -> x509.Certificate:
    return pki.load_certificate_pem(path.read_bytes())


def patch_bundle(path: Path) -> list[x509.Certificate]:
    (operation,) = yaml.safe_load(path.read_text())
    assert (operation["op"], operation["path"]) == ("add", "/spec/caBundle")
    return pki.load_certificates_pem(base64.b64decode(operation["value"]))


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(directory.iterdir())}


# ------------------------------------------------------------------------------- the CLI run

def test_cli_creates_every_file_with_private_keys_owner_only(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["certs", "--dir", str(tmp_path / "certs"),
                     "--manifests", str(tmp_path / "manifests"),
                     "--san", "adapter.example.com", "--san", "10.1.2.3"])
    assert code == 0
    certs = tmp_path / "certs"
    assert sorted(p.name for p in certs.iterdir()) == [
        "ca.crt", "ca.key", "kustomization.yaml", "serving.crt", "serving.key"]
    for key in ("ca.key", "serving.key"):
        assert stat.S_IMODE((certs / key).stat().st_mode) == 0o600
    assert stat.S_IMODE((certs / "serving.crt").stat().st_mode) == 0o644
    assert "issued serving certificate" in capsys.readouterr().out


def test_serving_certificate_names_usage_and_issuer(tmp_path: Path) -> None:
    ensure_certificates(options(tmp_path, sans=("adapter.example.com", "10.1.2.3", "::1")),
                        now=NOW)
    ca, serving = load(tmp_path / "certs/ca.crt"), load(tmp_path / "certs/serving.crt")
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "metricscale-adapter.metricscale.svc",
        "metricscale-adapter.metricscale.svc.cluster.local",
        "adapter.example.com"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.1.2.3", "::1"]
    usages = serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.SERVER_AUTH]
    serving.verify_directly_issued_by(ca)
    assert serving.not_valid_before_utc == NOW - timedelta(hours=1)
    assert serving.not_valid_after_utc == NOW + timedelta(days=365)


def test_serving_certificate_passes_a_hostname_checking_tls_client(tmp_path: Path) -> None:
    """What the aggregator does with caBundle: verify the chain and <service>.<namespace>.svc."""
    now = datetime.now(UTC)
    ensure_certificates(options(tmp_path, service="custom-metrics", namespace="monitoring"),
                        now=now)
    certs = tmp_path / "certs"
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(certs / "serving.crt", certs / "serving.key")
    client = ssl.create_default_context(cadata=(certs / "ca.crt").read_text())
    assert handshake(server, client, "custom-metrics.monitoring.svc") is None
    assert "Hostname mismatch" in str(handshake(server, client, "other.monitoring.svc"))


def handshake(server: ssl.SSLContext, client: ssl.SSLContext, hostname: str) -> Exception | None:
    """A TLS handshake through memory buffers; the client's error, if any."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client_side = client.wrap_bio(c_in, c_out, server_hostname=hostname)
    server_side = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, side in (("client", client_side), ("server", server_side)):
            if done[name]:
                continue
            try:
                side.do_handshake()
                done[name] = True
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError as error:
                if name == "client":
                    return error
                done[name] = True
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return None
    raise AssertionError("handshake did not finish")


def test_ca_bundle_patch_holds_the_ca_for_every_apiservice(tmp_path: Path) -> None:
    ensure_certificates(options(tmp_path), now=NOW)
    patch = tmp_path / "manifests/ca-bundle-patch.yaml"
    assert patch_bundle(patch) == [load(tmp_path / "certs/ca.crt")]
    assert patch.read_text().startswith("# Generated by `metricscale certs`")


def test_secret_kustomization_names_the_pair_and_namespace(tmp_path: Path) -> None:
    ensure_certificates(options(tmp_path, namespace="monitoring"), now=NOW)
    document = yaml.safe_load((tmp_path / "certs/kustomization.yaml").read_text())
    assert document["generatorOptions"] == {"disableNameSuffixHash": True}
    assert document["secretGenerator"] == [{
        "name": "metricscale-serving-cert", "namespace": "monitoring",
        "type": "kubernetes.io/tls", "files": ["tls.crt=serving.crt", "tls.key=serving.key"]}]


def test_private_key_file_names_are_git_ignored_and_certificates_are_not() -> None:
    git = require_tool("git")  # a failure, not a skip, under CI=true
    ignored = subprocess.run([git, "check-ignore", "certs/ca.key", "certs/serving.key"],
                             cwd=REPO, capture_output=True, text=True, check=False)
    assert ignored.stdout.split() == ["certs/ca.key", "certs/serving.key"]
    kept = subprocess.run([git, "check-ignore", "-q", "certs/ca.crt"], cwd=REPO, check=False)
    assert kept.returncode == 1


def test_no_manifests_writes_no_patch(tmp_path: Path) -> None:
    ensure_certificates(options(tmp_path, manifests=None), now=NOW)
    assert not (tmp_path / "manifests").exists()


# ------------------------------------------------------------------------ idempotence and renewal

def test_rerun_changes_nothing(tmp_path: Path) -> None:
    ensure_certificates(options(tmp_path), now=NOW)
    before = snapshot(tmp_path / "certs"), snapshot(tmp_path / "manifests")
    lines = ensure_certificates(options(tmp_path), now=NOW + timedelta(days=100))
    assert (snapshot(tmp_path / "certs"), snapshot(tmp_path / "manifests")) == before
    kept = tmp_path / "certs/serving.crt"
    assert lines == [f"kept serving certificate {kept} (until 2027-03-01)"]


def test_serving_certificate_near_expiry_is_renewed_by_the_same_ca(tmp_path: Path) -> None:
    ensure_certificates(options(tmp_path), now=NOW)
    ca_before = (tmp_path / "certs/ca.crt").read_bytes()
    patch_before = (tmp_path / "manifests/ca-bundle-patch.yaml").read_bytes()
    old = load(tmp_path / "certs/serving.crt")
    later = NOW + timedelta(days=340)
    ensure_certificates(options(tmp_path), now=later)
    new = load(tmp_path / "certs/serving.crt")
    assert new.serial_number != old.serial_number
    assert new.not_valid_after_utc == later + timedelta(days=365)
    assert (tmp_path / "certs/ca.crt").read_bytes() == ca_before
    assert (tmp_path / "manifests/ca-bundle-patch.yaml").read_bytes() == patch_before
    assert stat.S_IMODE((tmp_path / "certs/serving.key").stat().st_mode) == 0o600


def test_ca_near_expiry_rotates_and_the_bundle_trusts_old_and_new(tmp_path: Path) -> None:
    ensure_certificates(options(tmp_path), now=NOW)
    old_ca = load(tmp_path / "certs/ca.crt")
    later = NOW + timedelta(days=3640)
    ensure_certificates(options(tmp_path), now=later)
    new_ca = load(tmp_path / "certs/ca.crt")
    assert new_ca != old_ca
    assert load(tmp_path / "certs/ca-previous.crt") == old_ca
    assert patch_bundle(tmp_path / "manifests/ca-bundle-patch.yaml") == [new_ca, old_ca]
    load(tmp_path / "certs/serving.crt").verify_directly_issued_by(new_ca)
    # Once the old CA has expired it leaves the bundle.
    ensure_certificates(options(tmp_path), now=later + timedelta(days=30))
    assert patch_bundle(tmp_path / "manifests/ca-bundle-patch.yaml") == [new_ca]


def test_key_that_does_not_match_its_certificate_is_replaced(tmp_path: Path) -> None:
    ensure_certificates(options(tmp_path), now=NOW)
    stray = pki.generate_ca(common_name="stray", now=NOW, validity=timedelta(days=1))
    pki.write_private_key(tmp_path / "certs/serving.key", stray.private_key)
    ensure_certificates(options(tmp_path), now=NOW)
    certificate = load(tmp_path / "certs/serving.crt")
    key = pki.load_private_key_pem((tmp_path / "certs/serving.key").read_bytes())
    assert certificate.public_key() == key.public_key()


def test_force_reissues_the_serving_certificate_only(tmp_path: Path) -> None:
    ensure_certificates(options(tmp_path), now=NOW)
    ca, serving = load(tmp_path / "certs/ca.crt"), load(tmp_path / "certs/serving.crt")
    ensure_certificates(options(tmp_path, force=True), now=NOW)
    assert load(tmp_path / "certs/ca.crt") == ca
    assert load(tmp_path / "certs/serving.crt") != serving


def test_changed_names_reissue_the_serving_certificate(tmp_path: Path) -> None:
    ensure_certificates(options(tmp_path), now=NOW)
    serving = load(tmp_path / "certs/serving.crt")
    lines = ensure_certificates(options(tmp_path, sans=("10.0.0.9",)), now=NOW)
    assert load(tmp_path / "certs/serving.crt") != serving
    assert "names differ" in lines[0]


def test_renew_before_not_shorter_than_validity_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["certs", "--dir", str(tmp_path / "c"), "--no-manifests",
                     "--renew-before", "400d"])
    assert code == 2
    assert "--renew-before" in capsys.readouterr().err


# ------------------------------------------------------------------------------- the pieces

@pytest.mark.parametrize(("text", "expected"), [
    ("30d", timedelta(days=30)),
    ("720h", timedelta(hours=720)),
    ("1w2d", timedelta(days=9)),
    ("90m", timedelta(minutes=90)),
    ("3600s", timedelta(hours=1)),
    (" 1D ", timedelta(days=1)),
])
def test_duration_parsing(text: str, expected: timedelta) -> None:
    assert lifetime_argument(text) == expected


@pytest.mark.parametrize("text", ["", "30", "d", "1.5d", "30 days", "-1d"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(CertsError, match="invalid duration"):
        lifetime_argument(text)


def test_serving_names_sort_ips_from_dns_and_drop_duplicates() -> None:
    names = serving_names(service="m", namespace="n", cluster_domain="cluster.local",
                          sans=["M.N.SVC", "192.168.0.1", "x.example", "192.168.0.1"])
    assert names.common_name == "m.n.svc"
    assert names.dns_names == ("m.n.svc", "m.n.svc.cluster.local", "x.example")
    assert names.ip_addresses == ("192.168.0.1",)


@pytest.mark.parametrize(("service", "san"), [("m", "bad name"), ("m", "-x"), ("Bad_Svc", "ok")])
def test_serving_names_refuse_invalid_dns_names(service: str, san: str) -> None:
    with pytest.raises(CertsError):
        serving_names(service=service, namespace="n", cluster_domain="cluster.local", sans=[san])


def test_plan_for_a_fresh_directory_makes_both() -> None:
    names = serving_names(service="m", namespace="n", cluster_domain="cluster.local", sans=[])
    plan = plan_certificates(ca=None, serving=None, names=names, now=NOW,
                             renew_before=timedelta(days=30))
    assert (plan.new_ca, plan.new_serving) == (True, True)


@pytest.mark.parametrize(("days_left", "renew"), [(31, False), (30, True), (1, True)])
def test_plan_renews_at_the_renew_before_boundary(days_left: int, renew: bool) -> None:
    names = serving_names(service="m", namespace="n", cluster_domain="cluster.local", sans=[])
    ca = pki.generate_ca(common_name="ca", now=NOW, validity=timedelta(days=3650))
    serving = pki.issue_serving_certificate(
        ca, common_name="m.n.svc", dns_names=names.dns_names,
        now=NOW - timedelta(days=365) + timedelta(days=days_left), validity=timedelta(days=365))
    plan = plan_certificates(ca=ca.certificate, serving=serving.certificate, names=names,
                             now=NOW, renew_before=timedelta(days=30))
    assert (plan.new_ca, plan.new_serving) == (False, renew)


def test_plan_reissues_a_certificate_from_another_ca() -> None:
    names = serving_names(service="m", namespace="n", cluster_domain="cluster.local", sans=[])
    ca = pki.generate_ca(common_name="ca", now=NOW, validity=timedelta(days=3650))
    other = pki.generate_ca(common_name="other", now=NOW, validity=timedelta(days=3650))
    serving = pki.issue_serving_certificate(other, common_name="m.n.svc",
                                            dns_names=names.dns_names, now=NOW,
                                            validity=timedelta(days=365))
    plan = plan_certificates(ca=ca.certificate, serving=serving.certificate, names=names,
                             now=NOW, renew_before=timedelta(days=30))
    assert plan.new_serving and "not signed by the current CA" in plan.reasons[0]


def _extra_names(path: Path) -> set[str]:
    sans = load(path).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return ({*sans.get_values_for_type(x509.DNSName)}
            | {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)})


def test_rerun_without_an_earlier_san_keeps_it(tmp_path: Path) -> None:
    ensure_certificates(options(tmp_path, sans=("adapter.example.com", "10.0.0.5")), now=NOW)
    lines = ensure_certificates(options(tmp_path, sans=("10.0.0.9",)), now=NOW)
    names = _extra_names(tmp_path / "certs/serving.crt")
    assert {"adapter.example.com", "10.0.0.5", "10.0.0.9"} <= names
    assert any("kept earlier SAN(s) adapter.example.com, 10.0.0.5" in line for line in lines)


def test_rerun_with_no_san_at_all_keeps_the_certificate(tmp_path: Path) -> None:
    ensure_certificates(options(tmp_path, sans=("adapter.example.com",)), now=NOW)
    before = snapshot(tmp_path / "certs")
    lines = ensure_certificates(options(tmp_path), now=NOW)
    assert snapshot(tmp_path / "certs") == before
    assert lines[0].startswith("kept serving certificate")


def test_drop_san_removes_only_the_named_earlier_names(tmp_path: Path) -> None:
    ensure_certificates(options(tmp_path, sans=("adapter.example.com", "10.0.0.5")), now=NOW)
    ensure_certificates(options(tmp_path, drop_sans=("ADAPTER.example.com", "10.0.0.5")),
                        now=NOW)
    names = _extra_names(tmp_path / "certs/serving.crt")
    assert "adapter.example.com" not in names and "10.0.0.5" not in names
    assert "metricscale-adapter.metricscale.svc" in names


def test_cli_takes_drop_san(tmp_path: Path) -> None:
    from cli.main import main
    directory = str(tmp_path / "certs")
    assert main(["certs", "--dir", directory, "--no-manifests", "--san", "a.example"]) == 0
    assert main(["certs", "--dir", directory, "--no-manifests", "--drop-san", "a.example"]) == 0
    assert "a.example" not in _extra_names(tmp_path / "certs/serving.crt")


# ------------------------------------- --dir against the kustomization the patch is written to

@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the repository's certs-files component, the working directory as in a
    checkout (the component serves ../../../certs, that is certs/ here)."""
    import shutil

    component = tmp_path / "manifests" / "components" / "certs-files"
    shutil.copytree(REPO / "manifests" / "components" / "certs-files", component,
                    ignore=shutil.ignore_patterns("ca-bundle-patch.yaml"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_dir_other_than_the_one_the_component_serves_is_refused_and_nothing_written(
        checkout: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = sorted(str(p.relative_to(checkout)) for p in checkout.rglob("*"))
    assert cli.main(["certs", "--dir", "elsewhere"]) == 2
    captured = capsys.readouterr()
    component = Path("manifests/components/certs-files")
    assert captured.out == ""
    assert captured.err == (
        f"metricscale certs: --dir elsewhere: {component / 'kustomization.yaml'} serves the "
        f"certificate in {checkout / 'certs'}, so its caBundle patch must hold that CA, not "
        f"this one; give --dir {checkout / 'certs'}, or --no-manifests to only write the files "
        "(or --manifests for a kustomization of your own that takes them from here)\n")
    assert sorted(str(p.relative_to(checkout)) for p in checkout.rglob("*")) == before


def test_the_directory_the_component_serves_gets_a_patch_with_its_own_ca(
        checkout: Path) -> None:
    assert cli.main(["certs"]) == 0  # --dir certs, the component's ../../../certs
    patch = checkout / "manifests/components/certs-files/ca-bundle-patch.yaml"
    assert patch_bundle(patch) == [load(checkout / "certs/ca.crt")]
    assert cli.main(["certs", "--dir", str(checkout / "certs")]) == 0  # the same, absolute


def test_another_dir_without_the_patch_is_allowed(checkout: Path) -> None:
    assert cli.main(["certs", "--dir", "elsewhere", "--no-manifests"]) == 0
    assert (checkout / "elsewhere" / "ca.crt").is_file()
    assert not (checkout / "manifests/components/certs-files/ca-bundle-patch.yaml").exists()


def test_a_certificate_file_is_read_with_a_bound(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from metricscale.files import MAX_FILE_BYTES

    directory = tmp_path / "certs"
    assert cli.main(["certs", "--dir", str(directory), "--no-manifests"]) == 0
    capsys.readouterr()
    with (directory / "ca.crt").open("wb") as handle:  # sparse: no disk used
        handle.truncate(MAX_FILE_BYTES + 1)
    assert cli.main(["certs", "--dir", str(directory), "--no-manifests"]) == 2
    assert capsys.readouterr().err == (f"metricscale certs: cannot read {directory / 'ca.crt'}: "
                                       "larger than 16 MiB (the most a command reads)\n")
