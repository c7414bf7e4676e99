"""The control plane: ``streamrl launch`` places every role, supervises it and drives the run.

- ``run``: the ``Controller`` (start, report loop, end of run) and ``launch``.
- ``state``/``admission``/``staleness``: the run's live state, its admission server and policy.
- ``knobs``: the table of live config keys and the roles each one reaches.
- ``live``: the admin API's view of a running controller.
- ``specs``: what each role is started with (typed, torch-free).
- ``supervisor``: role health, restarts and elastic generators.
- ``placement``/``rundir``/``actors``: Ray placement and cores, the run directory, actor shells.

Importing this package imports nothing heavy. Workers and buffers never import it
(docs/design.md §2); what they share with it lives below both (``streamrl.cores``).
"""
