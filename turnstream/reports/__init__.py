"""What a run directory's logs say, read and drawn.

    run_log.py   learner.jsonl, eval.jsonl and memory.json read, and the sums taken of them (rolling success,
                 staleness, throughput)
    figures.py   the learning curve and the report's plots (`turnstream report RUN_DIR`, the demo's curve)
    progress.py  the live progress line of a running training run
    plotting.py  matplotlib drawing to files only
"""
