"""``python -m tidemark.cli``: the ``tidemark`` command, for hosts where the entry point is not on PATH."""

import sys

from tidemark.cli.main import main

sys.exit(main())
