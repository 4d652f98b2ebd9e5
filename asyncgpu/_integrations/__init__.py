"""Integrations with other tools: the IPython magic and the pytest plugin."""
