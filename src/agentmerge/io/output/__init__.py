"""What agentmerge writes: the shard plan and writer, atomic output folders, GGUF export."""
