"""The streamed merge: the frozen plan (``plan``), the inputs and statistics passes (``stream``), the driver
(``merge``), the dry run (``dryrun``), the probe (``probe``), what a merge leaves behind (``provenance``,
``report``) and ``convert`` (any readable input as a safetensors folder).
"""
