"""``python -m toolkernel`` runs the CLI."""

import sys

from toolkernel.cli import main

sys.exit(main())
