"""`python -m executor CONFIG.json`: one worker rank (see executor.run.worker; CONFIG is a RunConfig's JSON)."""

from executor.run.worker import main

raise SystemExit(main())
