"""``python -m sinklab.nn.native``: build (or find) the fused tile kernels and print whether they run."""

import sys

from sinklab.nn.native import main

sys.exit(main())
