"""``python -m rankmesh.bench`` is ``rankmesh bench`` (the meshes benchmark; ``rankmesh bench model``
is ``python -m rankmesh.bench.model``)."""

import sys

from rankmesh.bench.meshes import main

sys.exit(main(sys.argv[1:]))
