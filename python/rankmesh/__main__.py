"""``python -m rankmesh``: the ``rankmesh`` command (see :mod:`rankmesh.cli`)."""

import sys

from rankmesh.cli import main

sys.exit(main())
