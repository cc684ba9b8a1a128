"""Cost and planning: the pure cost model (``model``), its curves (``curve``), probing them on the
host (``probe``), the on-disk cache (``cache``) and the planner that stops where a layer does not pay
(``plan``)."""
