"""whiflash.eval"""
