"""`python -m hwrun.cli`: the same as the `hwrun` command."""

import sys

from .main import main

sys.exit(main())
