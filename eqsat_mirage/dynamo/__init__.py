"""``torch.compile(model, backend=em.backend)``: the pipeline as a TorchDynamo backend.

``backend.py``: partitions the FX graph into supported subgraphs, optimizes each through
``em.optimize`` and runs the rest eagerly, with a report of what ran where and why.
``support.py``: which nodes may join a partition (and why the others stay eager), and
which graphs mutate a tensor in place.
``specs.py``: what Dynamo recorded per node, and its symbolic sizes as shape families.
``runtime.py``: the module that runs an optimized partition in place of the eager one.
``options.py``: ``em.backend``'s options, checked when the backend is built.
``replay.py``: a static partition's launches replayed as a CUDA graph on CUDA inputs.
``experts.py``: mixture-of-experts layers of transformers models, each expert's MLP
through the backend (``em.use_experts``).
``report.py``: what the backend did with each partition (``PartitionReport``).

Takes: an FX graph module and example inputs from Dynamo.
Gives: a callable that runs the optimized partitions.
May import: every stage before it (ir ... pipeline).
"""
