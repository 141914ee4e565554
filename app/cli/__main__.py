"""`python -m app.cli ...`: the `pipebd` command line, as the service starts its own processes."""

import sys

from app.cli.main import main

sys.exit(main())
