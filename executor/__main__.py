"""`python -m executor ...`: one worker rank (see executor.run.worker)."""

from executor.run.worker import main

raise SystemExit(main())
