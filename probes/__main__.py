"""`python -m gpulens.probes`: the same as `gpulens probe`; the agent runs probes this way, in a child."""

import sys

from gpulens.probes.cli import main

sys.exit(main())
