"""``python -m rowstore.bench``: the same as the ``rowstore-bench`` command."""

import sys

from rowstore.bench import main

sys.exit(main())
