"""The learner role: its loop (``learner``), one optimizer step (``train_step``, ``critic``,
``lora_forward``), batches from the buffer (``batching``), FSDP2 (``fsdp``), checkpoints
(``checkpoint``) and the weight stream to the generators (``publisher``). docs/design.md §2."""
