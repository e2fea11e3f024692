"""Kubernetes object names as the API server validates them (apimachinery's IsDNS1123Label and
IsDNS1123Subdomain): the problem with a name, in upstream's words, or None."""

from __future__ import annotations

import re

__all__ = ["dns_label_problem", "dns_subdomain_problem"]

_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_MAX = 63
_SUBDOMAIN_MAX = 253
_LABEL_FORMAT = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters "
                 "or '-', and must start and end with an alphanumeric character (e.g. 'my-name', "
                 "or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
_SUBDOMAIN_FORMAT = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                     "characters, '-' or '.', and must start and end with an alphanumeric "
                     "character (e.g. 'example.com', regex used for validation is "
                     r"'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")


def dns_label_problem(name: str) -> str | None:
    """What is wrong with `name` as a DNS-1123 label (a namespace's name), or None."""
    if len(name) > _LABEL_MAX:
        return f"must be no more than {_LABEL_MAX} characters"
    if not name.isascii() or not _LABEL.fullmatch(name):
        return _LABEL_FORMAT
    return None


def dns_subdomain_problem(name: str) -> str | None:
    """What is wrong with `name` as a DNS-1123 subdomain (most objects' names), or None."""
    if len(name) > _SUBDOMAIN_MAX:
        return f"must be no more than {_SUBDOMAIN_MAX} characters"
    if not name.isascii() or not _SUBDOMAIN.fullmatch(name):
        return _SUBDOMAIN_FORMAT
    return None
