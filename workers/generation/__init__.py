"""The generator role: its loop (``generator``) and the parts it is built from — admission and
shard pushers (``generator_sockets``), delivery with served scoring (``generator_delivery``,
``scoring``), evaluation (``generator_evaluations``, ``evaluator``, ``eval_process``), weights
(``generator_weights``, ``subscriber``), reports (``generator_reports``) and sampling
(``sampling``, ``episodes``, ``rule_worker``). docs/design.md §2."""
