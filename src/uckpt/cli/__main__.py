"""``python -m uckpt.cli`` runs the ``uckpt`` command."""
import sys

from .main import main

sys.exit(main())
