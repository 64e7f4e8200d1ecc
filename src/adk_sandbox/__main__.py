"""``python -m adk_sandbox`` runs the ``adk-sandbox`` command."""

import sys

from adk_sandbox.executor.cli import main

sys.exit(main())
