"""The engine: ``Engine`` and the one step loop ``Run`` (``decode``), the prompt's ids and where a
run stops (``prompt``), which step each model runs on (``steps``) and the one way every front end
builds an engine from the settings (``build``)."""
