"""`python -m isthmus ...`: the `isthmus` command (apps/cli.py), as the console script runs it."""
import sys

from isthmus.apps.cli import main  # an entry point, like pyproject's console script: outside the layers

sys.exit(main())
