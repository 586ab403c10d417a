"""Compiled chunk kernels (numba): one pass over a chunk's stored bits per method, bit-identical to the reference.

The reference kernels (``agentmerge.methods.ram.kernels``, ``agentmerge.methods.ties.kernels``) are readable torch expressions
that make several passes over ``[N, E]`` float32 temporaries. For the methods whose rule is a
per-element loop over agents, this package runs the same float32 arithmetic in one compiled loop per
chunk: it widens the stored bits (bf16 or float32) itself, computes ``theta_0 + tau*`` and the chunk's
update-pattern counts (the ``[N, N]`` overlap histogram follows from them), and flags non-finite
inputs, with no temporaries larger than a cache-sized block.

- ``jit``: whether the kernels can run (``available``), and the numba decorator.
- ``loops`` / ``kernels``: RAM, RAM+, linear, task arithmetic and the overlap counts.
- ``ties_loops`` / ``ties``: TIES, DARE-TIES, DARE-linear, Breadcrumbs and RAM-TIES, with the exact
  per-tensor magnitude bounds from two radix-count passes.
- ``rng``: torch's CPU random stream (MT19937) reproduced for DARE's draws.

Results are bit-identical to the reference kernels (tests/test_speed_paths.py checks this): the same
float32 operations in the same order (agents summed 0..N-1 from zero, as ``deltas.sum_agents`` does), no
fused multiply-add, no fast-math. A method's compiled form is the ``compiled`` field of its registry
entry; ``AGENTMERGE_FUSED=0`` switches them all off.
"""
