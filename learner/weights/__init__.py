"""The policy's weights outside the network, for a push and for an export: what a push carries (source.py: the
policy's tensors, LoRA's adapters or merged weights), read bucket by bucket (buckets.py, also under fsdp2, where
each bucket is gathered from the shards) and written as Hugging Face safetensors files (files.py). The parallel
strategy reads a push's weights here, the weight-sync backends (learner/sync/) and `turnstream export`
(learner/checkpoint/export.py) write them; it imports nothing of the learner but LoRA's names."""
