"""``python -m jaxbench_env``: the ``jaxbench`` command line."""

from jaxbench_env.cli import main

raise SystemExit(main())
