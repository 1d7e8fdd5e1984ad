"""One module per `picasso` sub-command: `register(subparsers, common)` and `run(args)`."""
