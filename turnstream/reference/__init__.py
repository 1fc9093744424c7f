"""The reference pages generated from the code, each checked by a unit test so that it cannot drift.

    configuration.py  docs/configuration.md from the configuration models
                      (`python -m turnstream.reference.configuration --write`)
    metrics.py        docs/metrics.md from every role's metric classes, and the metric naming rules
                      (`python -m turnstream.reference.metrics --write`)
"""
