"""`python -m gpulens.probes`: the same as `gpulens probe`; the agent runs probes this way, in a child."""

import sys

from gpulens.probes.child import die_with_parent
from gpulens.probes.cli import main

die_with_parent()
sys.exit(main())
