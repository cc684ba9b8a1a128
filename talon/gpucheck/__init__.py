"""The GPU check: the Space's mechanics and losslessness on random-weight models at the presets'
shapes, with drafts accepted (``python -m talon.gpucheck``)."""
