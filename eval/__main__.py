"""`python -m whiflash.eval` = `whiflash-eval`."""
from whiflash.eval.cli import console

console()
