"""``python -m executor`` runs the ``adk-sandbox`` command."""

import sys

from executor.cli import main

sys.exit(main())
