"""agentmerge's cache folder (``store``) and the digests of input files it keeps (``digests``)."""
