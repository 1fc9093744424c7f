"""The record of a run's learner steps (`learner.record = true`): for every step, the Batch exactly as the buffer
served it, the learner's version, the run's seed and the step's RNG state, so that `turnstream replay` retrains the
run bit for bit without vLLM, actors or buffer, and `turnstream inspect` shows what any step saw.

format.py names the files and (de)serialises them, writer.py is the learner's side (rank 0), reader.py reads a
record back (`open_record`). The format is documented in format.py and docs/reproduce.md.
"""
