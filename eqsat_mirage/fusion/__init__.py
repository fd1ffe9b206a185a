"""The block and thread levels: schedules, their strategy, lowering and the fusion planner.

``schedule.py``: einsum-style schedules (index names mapped to grid axes or the loop) and
their legality. ``strategy.py``: candidate grids and loop ranges. ``lower.py``: a fragment
under a schedule to custom kernels. ``space.py``: a program's ops, their users and tensor
names, and a region of them cut out as one kernel's program. ``regions.py``: the region
search, which decides which ops share a kernel. ``planner.py``: ``plan`` prices regions
(each kernel's schedule by the GPU cost model), calls the region search and builds the
chosen partition; ``plans.py``: its records (a region's pricing, the plan and its
per-region report); ``alternatives.py``: other plans of the same program for measured tuning
(other schedules, library matmuls, next partitions). ``forms.py``: each extracted form
planned under the e-graph's kernel choices (``egraph.kernels``), duplicates planned once.

Takes: a kernel-level ``Graph`` and the edges that may be cut.
Gives: a ``FusionPlan`` holding a ``MuGraph`` of custom and predefined kernels.
May import: ir, frontend, semantics, verifier, mugraph, cost, egraph (its read-out choices).
"""
