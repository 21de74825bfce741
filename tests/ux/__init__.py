"""Tests of the tool under a person's hands: signals, terminals, pipes (issue 12)."""
