"""Attestations that report and verify both make and check: signing keys (:mod:`.keyring`), in-toto
statements in DSSE envelopes (:mod:`.dsse`), verification summaries (:mod:`.vsa`) and the lab's list of
vouched verifiers (:mod:`.verifiers`). ``marin.report`` and ``marin.verify`` import from here, never
from each other (tests/test_shape.py)."""
