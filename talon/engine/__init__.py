"""The engine: ``Engine``, the loaded pair and what outlives a request (``engine``); ``Run``, the one
step loop (``run``); the prompt's ids and where a run stops (``prompt``); how each model's forwards
run (``forwards``) and the one way every front end builds an engine from the settings (``build``)."""
