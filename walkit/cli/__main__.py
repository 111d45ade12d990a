"""``python -m walkit.cli``: the ``walkit`` command."""

import sys

from walkit.cli import main

sys.exit(main())
