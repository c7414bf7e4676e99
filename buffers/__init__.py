"""Replay buffer shards: the pure store and policy, the shard server, the learner-side client
and the durable log. Imports as ``streamrl.buffers``; never imports torch."""
