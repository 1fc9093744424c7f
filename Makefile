.PHONY: setup test test-all demo

setup:
	bash scripts/setup.sh

# what a contributor runs after a change: unit and integration tests
test:
	.venv/bin/python -m pytest -q tests/unit tests/integration

# everything, what CI runs: adds the end-to-end, cluster, Slurm and fault-injection tests
test-all:
	.venv/bin/python -m pytest -q

demo:
	.venv/bin/turnstream demo
