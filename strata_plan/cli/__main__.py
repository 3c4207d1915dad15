"""`python -m strata_plan.cli ARGS` runs `strata-plan ARGS`."""
import sys

from strata_plan.cli import main

sys.exit(main())
