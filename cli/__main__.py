"""`python -m graphc.cli ...`: the same as the `graphc` command."""

import sys

from .main import main

sys.exit(main())
