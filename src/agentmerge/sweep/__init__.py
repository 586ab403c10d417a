"""``agentmerge sweep``: merge-and-evaluate sweeps on Ray (local by default), resumable, with a results page.

- ``spec``: the sweep file and the trials it expands to (grid, random sample; stable trial ids).
- ``evaluators``: zoo, lm-eval or the user's Python function, each giving ``{metric: float}``.
- ``run``: Ray tasks, ``results.jsonl`` (one synced line per finished trial), resume, which folders to keep.
- ``cluster``: on a Ray cluster, every node's inputs checked before the first trial; where each trial ran.
- ``tune``: optuna's sampler as the search.
- ``report``: ``results.md`` ranked by the objective with ± SE over seeds, and plots.
"""
