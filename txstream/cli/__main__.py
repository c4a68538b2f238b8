"""`python -m txstream.cli ...` (what the tests and the chaos harness run)."""
import sys

from txstream.cli.main import main

sys.exit(main())
