"""`python -m spectrace ...`: the `spectrace` command with whichever interpreter runs it."""
import sys

from spectrace.cli import main

sys.exit(main())
