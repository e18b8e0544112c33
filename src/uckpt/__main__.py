"""``python -m uckpt ...``: the ``uckpt`` command, the same parser and exit statuses."""
import sys

from .cli.main import main

sys.exit(main())
