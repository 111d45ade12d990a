"""``python -m bookie --conf bookie.toml``: see :mod:`bookie._main`."""

import sys

from bookie._main import main

sys.exit(main())
