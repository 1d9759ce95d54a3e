"""`python -m whiflash.datagen` = `whiflash-datagen` (and `torchrun ... -m whiflash.datagen` on several GPUs)."""
from whiflash.datagen.cli import console

console()
