"""The control plane: ``streamrl launch`` places every role, supervises it and drives the run.

- ``run``: the ``Controller`` (start, report loop, end of run) and ``launch``.
- ``preflight``: every check of the input before any role starts, the one list ``streamrl
  validate`` and ``streamrl.train`` run too.
- ``context``: what the controller shares with its collaborators (``RunContext``), instead of
  itself.
- ``state``: the run's mutable state (``RunState``) and its one lock.
- ``intake``: every role's reports, each turned into one ``RunState`` change.
- ``admission``/``staleness``: the admission server and its pure off-policy budget.
- ``staleness_tuner``: ``buffer.max_staleness: auto``, the bound moved from the step records.
- ``difficulty``: ``data.sampler: difficulty``, fresh prompts whose groups all scored alike
  passed over.
- ``knobs``: the table of live config keys and the roles each one reaches.
- ``live``: the admin API's view of a running controller.
- ``specs``: what each role is started with (typed, torch-free).
- ``roles``: one typed id and slot per started role; role health for ``/status``.
- ``supervisor``: generators replaced when dead or silent, added and retired on demand.
- ``recovery``: buffer shards and the learner group started, and restarted when one dies
  (``Recovery.check_roles`` finds it).
- ``resume``: ``--resume``: the weight clock forked at the checkpoint, then the shards told,
  the admission budget and the prompt stream restored.
- ``reward_roles``: the reward roles of served rewards (reward models, judges) started before
  the generators, and restarted on their ports when one dies (docs/design.md §7c).
- ``processes``: a process named by pid and start time, so a reused pid is never signalled.
- ``records``/``drops``: the step records, the summary and the console's lines; the warning
  when every group is being dropped.
- ``generation_yield``: useful generation, the generated tokens that ended in a gradient and
  why the rest did not.
- ``retention``: ``run.keep_checkpoints``, the checkpoints kept (newest, best evaluated, not
  yet evaluated) and the rest removed; ``eval.keep_best``'s choice of the run's model.
- ``stopping``: the early-stopping rules (evaluation patience, starvation) that end a run
  before ``run.max_steps``.
- ``placement``/``rundir``/``actors``: Ray placement and cores, the run directory, actor shells.

Importing this package imports nothing heavy. Workers and buffers never import it
(docs/design.md §2); what they share with it lives below both (``streamrl.cores``).
"""
