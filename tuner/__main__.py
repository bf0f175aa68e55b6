from tuner.cli.main import main

raise SystemExit(main())
