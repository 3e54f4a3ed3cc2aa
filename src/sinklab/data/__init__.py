"""Data pipeline for pre-training: tokenizers, memory-mapped token files, packing, probe set.

* :mod:`sinklab.data.tokenizer` -- train a byte-level BPE or build the GPT-2 tokenizer.
* :mod:`sinklab.data.tokens` -- tokenize a corpus once into memmapped token files, split by document.
* :mod:`sinklab.data.packing` -- packing strategies (registry ``PACKING``) and batches.

The probe set the sink tracker measures on is cut by :mod:`sinklab.probe.windows` (one window cutter
for every probe).
"""
