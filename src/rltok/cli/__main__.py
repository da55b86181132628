"""`python -m rltok.cli ...`: the same as the `rltok` command."""

import sys

from rltok.cli import main

sys.exit(main())
