"""Static-shape forwards: a bucketed forward on a slot cache (``static``), replayed as CUDA graphs or
through ``torch.compile``, the pools of those forwards (``pool``) and the adaptive tree grown on the
device (``chain``)."""
