"""The server: a request's runtime (validation, the pair held, the device call and ZeroGPU,
streaming, Stop), reached by the views through one facade, ``talon.server.facade``."""
