"""whiflash.datagen"""
