"""The shipped presets (``*.json``), installed as the package ``selfplay.presets`` (see pyproject.toml).

Each preset is a JSON object with the nesting of ``selfplay.config.TrainConfig``; keys starting with ``_`` are
comments. ``populora train --preset NAME`` reads ``NAME.json`` from here; ``--preset path/to/file.json`` reads a
file of your own.
"""
