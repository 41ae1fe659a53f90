"""``marin verify``: replay a recorded run from its ledger alone and compare it bit for bit.

- ``verifier``: the eight numbered steps (run, recipe, workspace, inputs, determinism class,
  replay, comparison, verdict) as methods of one ``Verifier``, and ``verify``;
- ``upstream``: ``--upstream``, every run in a target's lineage;
- ``segments``: ``--segments K``, K checkpoint intervals of a train run drawn and replayed;
- ``workspace``: the git worktree at the recorded commit, its inputs and environment;
- ``compare``: recorded records against replayed ones; ``outcome``: what a verification found, and the verdict;
- ``--sign`` writes the signed verification summary of a verification record (``marin.attest.vsa``).

Exit 0: bit-exact. 1: a mismatch (the first diverging record, step and tensor are named).
3: the replay's determinism class differs from the recorded one; distances are reported
and the result is never called bit-exact. 4: the run cannot be verified here.
"""

from marin.verify.outcome import Outcome
from marin.verify.segments import draw
from marin.verify.upstream import upstream_exit, verify_upstream
from marin.verify.verifier import verify
from marin.verify.workspace import CannotVerify

__all__ = ["CannotVerify", "Outcome", "draw", "upstream_exit", "verify", "verify_upstream"]
