"""`python -m gputopo` is the `gputopo` command."""

import sys

from gputopo.app.cli import main

sys.exit(main())
