"""A scenario, from its YAML to the run, in the order it is resolved (``runner.resolve``):

1. ``config.py``: loaded and validated (``load_scenario``, ``validate``, ``ScenarioConfig``;
   ``--set`` overrides), every key checked, one line naming the field on bad input.
2. ``parallel.py``: ``parallel:`` made concrete (the expert-parallel degree in the cost
   model; later, the data-parallel ranks of the run).
3. ``cluster.py``: ``cluster:`` resolved per replica group (each group's scheduler as in 4).
4. ``runner.py``'s ``scheduler_for``: vLLM's defaults (the budgets ``vllm serve`` sets for
   the GPUs), then ``num_blocks_for``, the KV cache derived from GPU memory.
5. ``offload.py`` and ``swap.py``: KV tiers below the GPU and swap preemption (bytes per
   token, host links, host memory checked).
6. ``feasibility.py``: the deployment fits its GPUs' memory, nodes and budgets.
7. ``runner.py``'s ``build`` and ``run``: the workload, the cost model and the scheduler,
   one server, data-parallel ranks (``parallel.py``) or a cluster (``cluster.py``).
"""
