"""The command lines. ``main`` is ``python -m talon`` (generate, costs, atlas); its commands live
in ``costs`` and ``atlas``; ``bench`` is ``python -m talon.bench``; ``args`` holds the flags they
share, built from where each choice and default is defined (``settings``, ``run_config``)."""
