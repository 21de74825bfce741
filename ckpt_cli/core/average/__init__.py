"""``average``: a new step whose float leaves are the weighted mean (or the exponential moving
average) of several steps of one root, streamed block by block; ``plan`` and ``execute`` are the
entry points."""
