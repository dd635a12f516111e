"""hwrun's inference room: `generate()` (`generate.py`), the batching choice (`batching.py`), the
Transformers pipeline (`pipeline.py`) and the graph decoders (`decode/`)."""
