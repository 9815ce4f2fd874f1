"""``python -m simulator`` is the ``servesim`` command."""

import sys

from simulator.cli import main

sys.exit(main())
