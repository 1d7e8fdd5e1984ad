from picasso.cli import main

raise SystemExit(main())
