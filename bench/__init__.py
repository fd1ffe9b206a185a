"""eqsat-mirage benchmarks: the six programs of DESIGN.md and the results scripts."""
