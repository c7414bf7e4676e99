"""The reward roles that serve models to the generators: the role (``reward_role``), its
request queue (``score_queue``) and the LLM judge (``judge``). docs/design.md §2 and §7c."""
