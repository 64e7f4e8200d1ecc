"""``python -m adk_sandbox.executor`` runs the ``adk-sandbox`` command (as ``python -m adk_sandbox`` does)."""

import sys

from adk_sandbox.executor.cli import main

sys.exit(main())
