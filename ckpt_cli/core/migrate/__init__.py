"""``migrate``: a reviewed spec of rules applied to a checkpoint, streamed into a new step.

``spec`` parses and validates the rules, ``tree`` and ``rules`` apply them to the leaves (the
optimizer state following the parameters), ``ops`` are the lazy expressions that compute a
region of a destination leaf, ``initializers`` fill new values, ``layout`` chooses chunks and
sharding, ``target`` compares with the new model's abstract state; ``plan`` and ``execute``
are the entry points.
"""
