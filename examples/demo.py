"""Demo: build a tiny base and three RL-like agents, probe them, merge them with RAM, RAM+ and averaging,
and check that every merged model loads in transformers and generates.

    python examples/demo.py [WORKDIR]      (default: ./demo-out)
"""

import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from agentmerge import MergeConfig, ModelSpec, merge, probe
from agentmerge.engine.render import agents_table
from agentmerge.synthetic import write_family


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "demo-out")
    shutil.rmtree(root, ignore_errors=True)
    base, agents = write_family(root / "models", "tiny", densities=[0.03, 0.46, 0.54], seed=0)
    print(f"wrote a base and {len(agents)} agents under {root / 'models'}\n")

    report = probe(str(base), [str(a) for a in agents], quiet=True)
    print(agents_table(report.agents, report.independent), "\n")

    for method in ("ram", "ram_plus", "linear"):
        cfg = MergeConfig(method=method, base=str(base), models=[ModelSpec(path=str(a)) for a in agents])
        result = merge(cfg, root / f"merged-{method}", quiet=True)
        model = AutoModelForCausalLM.from_pretrained(result.out_dir)
        out = model.generate(torch.tensor([[2, 3, 4]]), max_new_tokens=6, do_sample=False)
        print(f"{method:>9}: {result.out_dir} ({result.seconds:.2f} s), generates {out[0].tolist()}")


if __name__ == "__main__":
    main()
