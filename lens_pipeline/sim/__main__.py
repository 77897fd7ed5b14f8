"""`python -m lens_pipeline.sim`: the same as `lens sim`."""

import sys

from lens_pipeline.sim.cli import main

sys.exit(main())
