"""Temporary alias: the adapter's auth test helpers moved to tests/adapter/auth_support.py.

tests/autoscaler/fake_cluster.py (being reshaped) still imports them from here; import
tests.adapter.auth_support instead, and delete this module once nothing imports it. It holds no
tests (the helpers' own checks are in tests/adapter/test_support.py).
"""

from tests.adapter.auth_support import *  # noqa: F403
from tests.adapter.auth_support import SERVICE_NAME, SERVICE_NAMESPACE  # noqa: F401
