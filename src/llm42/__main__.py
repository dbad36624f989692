"""``python -m llm42``: the command line (see ``llm42.cli``)."""

import sys

from llm42.cli import main

sys.exit(main())
