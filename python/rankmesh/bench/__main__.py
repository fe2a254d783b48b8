"""``python -m rankmesh.bench`` is ``rankmesh bench``."""

import sys

from rankmesh.cli import main

sys.exit(main(["bench", *sys.argv[1:]]))
