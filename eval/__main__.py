"""`python -m whiflash.eval` = `whiflash-eval`."""
import sys

from whiflash.eval.cli import main

sys.exit(main())
