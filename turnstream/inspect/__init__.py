"""Looking into a recorded run (learner.record = true): `turnstream inspect` shows what each learner step trained on
(main.py), `turnstream regenerate` samples a recorded episode again token for token (regenerate.py). docs/reproduce.md
says what is and is not reproducible."""
