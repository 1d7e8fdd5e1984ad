"""`python -m executor ...`: one worker rank (see executor.worker)."""

from executor.worker import main

raise SystemExit(main())
