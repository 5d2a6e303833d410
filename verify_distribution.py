"""Is speculative sampling lossless? The statistical judge, run from a checkout.

    python verify_distribution.py --help       # what each part tests, how long, PASS, exit codes
    python verify_distribution.py --quick      # the CI subset

The judge is the package minispec/judge/ (also `python -m minispec judge` once installed).
"""

import sys

from minispec.judge import main

if __name__ == "__main__":
    sys.exit(main())
