"""zaya_compare - the parts of compare.py (docs/compare.md, "compare.py's parts").

dumps.py     reading and writing dumps, the input checks        names.py    tensor names, order, tolerances
metrics.py   row metrics, top-k, log-sum-exp, KL (numpy)        endtoend.py the plain comparison
envelope.py  --envelope (is it bf16 or a bug?)                  local.py    --local (the layer-local replay)
"""
