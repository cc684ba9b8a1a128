"""The algorithm's pieces: grow a draft tree under TALON's gates (``builder``), verify it in one
target forward (``verify``), accept a path (``accept``), keep the accepted path's KV (``kv``)."""
