"""``python -m rowstore.cli``: the ``rowstore`` command."""

import sys

from rowstore.cli import main

sys.exit(main())
