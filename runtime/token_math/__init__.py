"""Token math shared by the sampler (runtime/sampling/) and the kernels (runtime/kernels/).

Pure lazy mx functions with no policy in them: the murmur hash (murmur.py), the Gumbel noise
keyed by (seed, position, token id) (noise.py), rank keys and a row's first ranks (ranks.py),
and the filters with the Gumbel-max over ranked candidates (choose.py). A kernel's reference
and check call them, and so does the sampler; neither package sits above the other, so both
import from here and nothing here imports another graphc package (tests/test_imports.py).
"""
