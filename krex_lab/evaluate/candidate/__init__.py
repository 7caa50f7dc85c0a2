"""The candidate's side of an evaluation: the sandboxed process that loads and calls the candidate's
code (:mod:`.zygote`, :mod:`.process`, :mod:`.outputs`, :mod:`.sandbox`). It imports only the
channel to its judge (:mod:`krex_lab.evaluate.channel`) and leaf modules, never the judge, and this
file imports nothing, so loading one of its modules loads nothing else."""
