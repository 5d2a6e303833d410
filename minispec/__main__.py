"""`python -m minispec`: the command line (minispec/cli.py)."""

import sys

from .cli import main

sys.exit(main())
