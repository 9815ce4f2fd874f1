"""Clusters: replicas behind a router on one clock, and prefill/decode disaggregation.

``config.py`` is the scenario's ``cluster:``; ``router.py`` the interface a router implements
and ``routers.py`` the built-in ones; ``replica.py`` what a router reads of a replica;
``kv_link.py`` the KV link; ``cluster.py`` wires it all on a simpy clock; ``tables.py``
builds its results.
"""
