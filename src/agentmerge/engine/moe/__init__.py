"""``agentmerge moe``: one mixture-of-experts model whose experts are the agents.

From a dense Llama / Mistral / Qwen2 base and N agents: attention, embeddings and norms from a static merge
(any method of the registry, RAM by default), one expert per agent (its MLP), optionally a shared expert
(Qwen2-MoE), and a router set without training from each agent's example prompts. ``moe_config`` reads
the configuration without torch, ``arch`` maps the dense architecture to its MoE counterpart, ``moe_plan`` plans
the output, ``router`` computes the router rows, ``build`` drives it, ``moe_dryrun`` checks all without writing,
``record`` writes what it did.
"""
