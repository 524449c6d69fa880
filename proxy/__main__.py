"""`python -m proxy …` runs the `interlock` command (as the console script does)."""

from proxy.ops.cli import main

raise SystemExit(main())
