"""The real zoo: GRPO agents of a pretrained LLM (SmolLM2-135M-Instruct) merged with every method.

Three agentic skills with verifiable rewards (tool calling, code in a restricted Python subset, memory recall) and
a held-out skill no agent trains on, prompted in the model's chat template; agents trained by GRPO with full
fine-tuning; every merge method scored on them. See docs/real/README.md.
"""
