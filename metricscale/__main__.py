"""`python -m metricscale`: the same as the `metricscale` console script."""

import sys

from cli.main import main

sys.exit(main())
