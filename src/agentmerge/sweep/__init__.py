"""``agentmerge sweep``: merge-and-evaluate sweeps on Ray (local by default), resumable, with a results page.

- ``sweepfile``: the sweep file and the trials it expands to (grid, random sample; stable trial ids).
- ``evaluators``: zoo, lm-eval or the user's Python function, each giving ``{metric: float}``.
- ``run``: Ray tasks, ``results.jsonl`` (one synced line per finished trial), resume, which folders to keep;
  ``results``: ``results.jsonl`` read back field by field, and the only folders a sweep removes.
- ``cluster``: on a Ray cluster, every node's inputs checked before the first trial; where each trial ran.
- ``tune``: optuna's sampler as the search.
- ``sweep_report``: ``results.md`` ranked by the objective with ± SE over seeds, and plots; ``search_report``
  the same page for a search.
"""
