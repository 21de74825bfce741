"""``ckpt cp``: copy a run, a step or a range of steps between local disk and buckets, the way
Orbax needs it (data first, commit markers last), resumable after a kill.

``plan`` decides what to copy and reads what the destination already holds; ``execute`` streams
the objects (several in flight) under the destination's write claim.
"""
