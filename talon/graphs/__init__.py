"""The static-shape step: a bucketed forward on a slot cache (``static``), CUDA graphs and
``torch.compile`` over it, the pools of those forwards (``pool``) and the adaptive tree grown on the
device (``chain``)."""
