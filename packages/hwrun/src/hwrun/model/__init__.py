"""hwrun's model room: the plan (`plan.py`), where weights come from (`source.py`), loading
(`load.py`), quantization rules, adapter folders and the tested model families."""
