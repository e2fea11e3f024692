"""The one Kubernetes access layer of both programs: HTTP, errors, retries, discovery, informers."""
