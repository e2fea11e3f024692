"""`python -m metricscale`: the same as the `metricscale` console script."""

import sys

from metricscale.cli import main

sys.exit(main())
