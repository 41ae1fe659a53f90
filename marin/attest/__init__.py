"""Attestations that report and verify both make and check: signing keys (:mod:`.keyring`), the typed
envelope, statement and summary (:mod:`.models`), in-toto statements in DSSE envelopes (:mod:`.dsse`),
verification summaries (:mod:`.vsa`), the lab's list of vouched verifiers (:mod:`.verifiers`) and the
trust policy (:mod:`.policy`). ``marin.report`` and ``marin.verify`` import from here, never from each
other, and nothing here imports them (tests/test_shape.py)."""
