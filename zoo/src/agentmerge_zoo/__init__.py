"""The agent zoo: a CPU-sized test bed of RL-trained agents for measuring what merging keeps.

A tiny Llama base is pretrained on generated tasks in three agentic domains (coding, tool use, memory) plus a
held-out skill; one agent per domain is RL-trained from it with a GRPO-style loop and bfloat16 weight storage;
``agentmerge zoo bench`` merges the agents with every method and reports, per metric, what survived.
See docs/zoo.md.
"""
