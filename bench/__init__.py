"""`seq2onnx bench`: the PyTorch reference, the ONNX runtime and CTranslate2 on the same model and sentences.

  settings.py  the thread settings each engine is tried at (the sweep), and their names
  engines/     the child process: one engine at one setting, loaded and timed
               (python -m seq2onnx.bench.engines); one Runner class per engine kind, registered by
               name (engines/base.py)
  machine.py   the machine's description (CPU, cores, memory, load, versions)
  run.py       the run: sentences, bundles, one child per engine and setting, the report dict
  rows.py      the children's results -> rows: tokens/s, percentiles, agreement, ratios, the best rows
  report.py    the report as text
The command itself is commands/bench.py; scripts/ holds the scripts a person runs by hand.
"""
