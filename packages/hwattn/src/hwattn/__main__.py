"""`python -m hwattn` prints the README decision tables; `--update README.md` rewrites their blocks."""

from .table import main

raise SystemExit(main())
