"""The streamed merge: the frozen plan (``merge_plan``), the opened inputs (``inputs``), chunk jobs on a thread pool
(``parallel``), the statistics passes (``counting``, with what they keep across runs in ``caches``), the
driver (``merge``), the dry run (``merge_dryrun``), the probe (``probe``), what a merge leaves behind
(``provenance``; ``render``: the model card, the summary, the probe's markdown and plots) and ``convert`` (any
readable input as a safetensors folder).
"""
