"""The writers' machinery: a step written so that no reader takes it for finished before it is.

``types`` (what a leaf is made of), ``pipeline`` (blocks in flight under a byte budget),
``item`` (one item directory), ``step`` (tmp name or in place, commit), ``rewrite`` (a new step
from a source step: the one rewritten item plus copies of the others), ``distributed`` (the
arrays of an item written by an executor's workers), ``memory`` (the allocator bounded).
"""
