"""`python -m headcoop ...`: the same command line as `headcoop ...` (issue 76)."""

import sys

from headcoop.cli import main

if __name__ == "__main__":
    sys.exit(main())
