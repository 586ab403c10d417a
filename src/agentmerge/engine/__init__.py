"""The streamed merge: the frozen plan (``plan``), the opened inputs (``inputs``), chunk jobs on a thread pool
(``parallel``), the statistics passes (``counting``, with what they keep across runs in ``caches``), the
driver (``merge``), the dry run (``dryrun``), the probe (``probe``), what a merge leaves behind
(``provenance``, ``report``) and ``convert`` (any readable input as a safetensors folder).
"""
