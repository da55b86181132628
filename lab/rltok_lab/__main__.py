"""`python -m rltok_lab ...`: the lab's study steps and instruments."""

import sys

from rltok_lab.cli import main

sys.exit(main())
