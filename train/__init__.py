"""whiflash.train"""
