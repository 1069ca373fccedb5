"""SHARP scheduling: the Sharded-LRTF policy, the Redis shard task queue, and the loop a device worker runs."""
