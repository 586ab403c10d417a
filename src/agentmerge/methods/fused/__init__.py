"""Compiled (numba) helpers shared by the methods' compiled forms; below the methods, importing none of them.

A method's compiled form (a ``spec.Compiled``: ``ram/compiled.py``, ``arithmetic/compiled.py``,
``ties/compiled.py``, ``field/compiled.py``, ``spherical/compiled.py``) runs the same float32 arithmetic as its
reference kernel in one compiled loop per chunk: it widens the stored bits (bf16 or float32) itself, computes
``theta_0 + tau*`` and the chunk's update-pattern counts (the ``[N, N]`` overlap histogram follows from them),
and flags non-finite inputs, with no temporaries larger than a cache-sized block. What they share lives here:

- ``jit``: whether the kernels can run (``available``), and the numba decorator.
- ``kernels``: a chunk's stored bits (``RawChunk``), the output buffer, the overlap counts (``counts``).
- ``loops``: the per-element loops of RAM, RAM+, linear, task arithmetic and the counts.
- ``gram``: the exact block dot products (``stats.py``, the spherical methods, SCE).
- ``rng``: torch's CPU random stream (MT19937) reproduced for DARE's draws.

Results are bit-identical to the reference kernels (tests/test_speed_paths.py checks this): the same
float32 operations in the same order (agents summed 0..N-1 from zero, as ``deltas.sum_agents`` does), no
fused multiply-add, no fast-math. A method's compiled form is the ``compiled_at`` field of its registry
entry; ``AGENTMERGE_FUSED=0`` switches them all off. ``tests/test_layers.py`` checks that nothing here imports a
method's package.
"""
