"""`python -m mtpc.cli ...` (as `torchrun -m mtpc.cli` needs) is the `mtpc` command."""

import sys

from .commands import main

sys.exit(main())
