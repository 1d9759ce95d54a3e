"""whiflash.train: fit, evaluate, export and push the WhiFlash-Neural router (CLI ``whiflash-train``).

Modules: ``dataset`` (the router dataset contract shared with datagen), ``synthetic`` (planted-signal
datasets in that format), ``data`` (``RouterDataModule``), ``task`` (``RouterTask``), ``metrics`` (routing
replay metrics), ``export`` (Hub-ready folder, single file, model card), ``plots``, ``push`` and ``cli``.
"""
