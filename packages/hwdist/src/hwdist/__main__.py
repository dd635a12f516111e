"""`python -m hwdist` = the `hwdist` console script."""

import sys

from .cli import main

sys.exit(main())
