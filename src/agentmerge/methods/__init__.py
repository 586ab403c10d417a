"""The merge methods: the types between driver and kernels (``spec``), the one table of methods (``registry``),
one reference kernel module per family (``ram``, ``baselines``), their tensor primitives (``deltas``, ``masks``,
``stats``, ``groups``) and compiled twins (``fused``). Pure tensor math: nothing here reads or writes a file.
"""
