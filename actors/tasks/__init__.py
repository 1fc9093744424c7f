"""Which task each episode plays ([tasks]): `orders` (random, sequential, spo) make the draws, `source` hands
each draw to a group of episodes, `curriculum` holds SPO's weights and the learner's tracker values,
`position` keeps a sequential order's place across restarts, `eval_split` holds tasks out for evaluation."""
