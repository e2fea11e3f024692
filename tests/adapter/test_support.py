"""The test helpers themselves (tests/adapter/harness.py, tests/adapter/auth_support.py)."""

from __future__ import annotations

from pathlib import Path

from cryptography import x509

from metricscale import pki
from tests.adapter.auth_support import _parse_reply, make_pki, secrets_in
from tests.adapter.harness import SERVICE_DNS, make_serving_pair


def test_chunked_bodies_are_reassembled() -> None:
    reply = _parse_reply(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    assert (reply.status, reply.body) == (200, b"abcde")


def test_secret_scan_finds_tokens_and_key_bodies(tmp_path: Path) -> None:
    test_pki = make_pki(tmp_path)
    key_text = test_pki.serving_key.read_text()
    inner = "".join(line for line in key_text.splitlines() if not line.startswith("-----"))
    assert secrets_in(f"x {inner} y", tokens=["tok-123"],
                      key_files=test_pki.key_files()) == ["key material of serving.key"]
    assert secrets_in("Bearer tok-123", tokens=["tok-123"], key_files=[]) == ["token tok-…"]
    assert secrets_in("nothing here", tokens=["tok-123"], key_files=test_pki.key_files()) == []


def test_serving_pair_names_localhost_and_the_service(tmp_path: Path) -> None:
    pair = make_serving_pair(tmp_path)
    certificate = pki.load_certificate_pem(pair.cert_file.read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == {"localhost", SERVICE_DNS}
