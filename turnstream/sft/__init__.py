"""`turnstream sft`: a supervised warm start on multi-turn chat transcripts (docs/learning.md, "Supervised warm
start"). transcripts.py renders a transcript as the actors' token path would; train.py trains on them with the
learner's model code and writes a Hugging Face directory; run.py is the command and `warm_start`, its function."""
