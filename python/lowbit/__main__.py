"""`python -m lowbit` runs the `lowbit` command line."""

import sys

from lowbit.cli import main

sys.exit(main())
