.PHONY: setup test demo

setup:
	bash scripts/setup.sh

test:
	.venv/bin/python -m pytest -q

demo:
	.venv/bin/turnstream demo
