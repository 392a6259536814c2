"""The selection kinds a row group can be (tensors.py assigns them, select.py and fused.py
dispatch on them): a module of its own so that the selectors need not import the tensors
that are built from them."""

GREEDY, PLAIN, CANDIDATES, FULL = "greedy", "plain", "candidates", "full"
