"""Signed verification summaries (VSAs): what ``marin verify --sign`` writes, and what one must say to be
backed by the ledger (``backing_problem``); which ones count is the trust policy's (:mod:`.policy`).

A VSA is an in-toto Statement v1 with a SLSA Verification Summary v1 predicate
(https://slsa.dev/spec/v1.0/verification_summary) about one verified run, in a DSSE envelope
signed with ed25519 (``marin.attest.dsse`` builds, signs and checks envelopes). It is built
from the ``verification`` record ``marin verify`` appended to the run, never from the machine
anew: the result, mode, CPU and determinism class are the record's.

Layout, at the project root (committed and pushed with the ledger):

    verifications/<run_id>/<key id>.intoto.json   one per run and verifier key (re-signing replaces it)
    verifications/keys/<key id>.pub               the verifier's public key (PEM)

A key id is the sha256 of the raw ed25519 public key, so a key file put under another key's id
verifies nothing: the reader recomputes the id from the file. An envelope whose key file is
absent is "unverifiable", never counted. The VSA's typed model is :class:`marin.attest.models.Vsa`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import cast

from marin import env, fsutil, hashing
from marin.attest import dsse, keyring, verifiers
from marin.attest.models import FAILED, NS, PASSED, VSA_TYPE, JsonObject, Statement, Vsa
from marin.errors import MarinError
from marin.ledger.bodies import VerificationBody, compared_nothing
from marin.ledger.records import Record
from marin.ledger.store import RunLog, load_run

VERIFIER_ID = "https://marin.local/verifier/marin-verify@v1"
POLICY_URI = "https://marin.local/policy/replay-from-ledger@v1"
DIR = "verifications"
KEYS = "keys"
SUFFIX = ".intoto.json"
CITED = {  # what the report cites of a counted VSA: label -> pointer into the signed statement
    "keyid": ("verifier key id", "/predicate/marin/verifier/keyid"),
    "cpu": ("verifier CPU", "/predicate/marin/verifier/cpu_model"),
    "features": ("verifier CPU features", "/predicate/marin/verifier/cpu_features"),
    "determinism": ("verifier determinism class digest", "/predicate/marin/verifier/determinism_digest"),
    "mode": ("verification mode", "/predicate/marin/mode"),
    "result": ("verification result", "/predicate/marin/result"),
    "summary": ("verification summary result", "/predicate/verificationResult"),
    "when": ("time verified", "/predicate/timeVerified"),
}


def cited(v: Vsa) -> list[str]:
    """The pointers the report cites in ``v`` (a segments replay adds its K of N)."""
    return [ptr for _, ptr in CITED.values()] + ([f"/predicate/marin/segments/{k}" for k in "kn"]
                                                   if v.mode == "segments" else [])


def resource_uri(run_id: str) -> str:
    return f"marin:run/{run_id}"


def envelope_path(root: Path, run_id: str, kid: str) -> Path:
    return Path(root) / DIR / run_id / f"{kid}{SUFFIX}"


def key_file(root: Path, kid: str) -> Path:
    return Path(root) / DIR / KEYS / f"{kid}.pub"


# -- writing --------------------------------------------------------------------------------


def level(verification: VerificationBody) -> str:
    """The verified level (a custom SlsaResult: SLSA reserves the ``SLSA_`` prefix): the whole run
    replayed bit-exact, or K of its N checkpoint intervals."""
    if verification["mode"] == "segments":
        s = verification["segments"]  # pyright: ignore[reportTypedDictNotRequiredAccess]  # segments mode records it
        return f"MARIN_REPLAY_SEGMENTS_{s['k']}_OF_{s['n']}"
    return "MARIN_REPLAY_FULL"


def cpu(verifier: Mapping[str, object]) -> JsonObject:
    """The verifier's CPU and determinism class, as the verification record holds them."""
    e = cast(dict[str, object], verifier.get("env", {}))
    det = cast(dict[str, object], verifier.get("determinism_class", {}))
    return {"cpu_model": e.get("cpu_model"), "cpu_features": e.get("cpu_features", e.get("isa_flags", [])),
            "machine": e.get("machine"), "usable_cores": e.get("usable_cores"),
            "determinism_class": det, "determinism_digest": env.class_digest(det)}


def summary(stage: str, rec: Record, kid: str) -> Statement:
    """The in-toto Statement of a VSA about the run verified by ``rec`` (a ``verification`` record),
    to be signed by key ``kid``. PASSED when the verifier exited 0 (its verdict is bit-exact)."""
    b = rec.body_as("verification")
    v = b["verified"]
    run_id, passed = v["run_id"], b["exit_code"] == 0
    marin: JsonObject = {
        "run_id": run_id, "stage": stage, "result": b["result"], "exit_code": b["exit_code"], "mode": b["mode"],
        "segments": b.get("segments"), "verifier": {"keyid": kid, **cpu(b["verifier"])},
        "compared": b["compared"], "first_divergence": b["first_divergence"],
        "verification_record": {"seq": rec.seq, "digest": rec.digest, "time": rec.time}}
    predicate = {
        "verifier": {"id": VERIFIER_ID},
        "timeVerified": rec.time,
        "resourceUri": resource_uri(run_id),
        "policy": {"uri": POLICY_URI},
        "inputAttestations": [{"uri": f"{resource_uri(run_id)}#run.finished",
                               "digest": {"sha256": hashing.parse(v["finished_digest"]).hex()}}],
        "verificationResult": PASSED if passed else FAILED,
        "verifiedLevels": [level(b)] if passed else [FAILED],
        "slsaVersion": "1.0",
        NS: marin,
    }
    subjects = [(f"{resource_uri(run_id)}#run.finished", v["finished_digest"]),
                (f"{resource_uri(run_id)}#recipe", v["recipe_digest"])]
    return dsse.statement(subjects, predicate, predicate_type=VSA_TYPE)


def signer_key(root: Path, explicit: Path | None, as_lab: bool = False) -> Path:
    """The key a VSA is signed with: ``--key``, else the lab's (``keyring.signing_key``), checked to be a
    usable ed25519 key.
    The lab's report key (the default) only with ``as_lab``: a VSA it signs is the lab's own replay,
    never an independent one, and the report counts it so."""
    configured = _report_key(root)
    key = explicit or configured
    if key is None:
        raise keyring.SigningKeyError("no signing key: give --key KEY (`marin keygen KEY` makes one)")
    kid = keyring.keyid(keyring.load_private_key(key))
    if not as_lab and configured is not None and configured.exists() \
            and kid == keyring.keyid(keyring.load_private_key(configured)):
        raise keyring.SigningKeyError(
            f"{fsutil.shown(key)} is the lab's report signing key: a VSA signed with it is the lab's own replay, "
            "not an independent verification; sign with your own key (--key KEY, `marin keygen KEY` makes one), "
            "or pass --as-lab to sign as the lab")
    return key


def _report_key(root: Path) -> Path | None:
    """The lab's report signing key ($MARIN_SIGNING_KEY, else report.signing_key), or None when unset."""
    from marin import config

    try:
        return keyring.signing_key(root, config.load(Path(root) / "params.yaml").report)
    except keyring.SigningKeyError:
        return None


def publish_key(root: Path, key: Path) -> tuple[str, Path]:
    """verifications/keys/<key id>.pub for the private ``key`` (written when absent): its id and path."""
    public = keyring.load_private_key(key).public_key()
    kid = keyring.keyid(public)
    path = key_file(root, kid)
    if path.exists():
        there = keyring.keyid(keyring.load_public_key(path))
        if there != kid:
            raise keyring.SigningKeyError(f"{fsutil.shown(path)}: holds key {there}, not {kid}: remove that file")
    else:
        fsutil.write_bytes(path, keyring.public_pem(public))
    return kid, path


def sign(root: Path, run_id: str, seq: int, key: Path) -> Path:
    """Sign the verification record ``seq`` of ``run_id`` as a VSA; write it; return its path."""
    log = load_run(root, run_id)
    rec = next((r for r in log.records if r.seq == seq and r.kind == "verification"), None)
    if rec is None:
        raise MarinError(f"{run_id}: no verification record at seq {seq} to sign")
    kid = keyring.keyid(keyring.load_private_key(key))
    if (rec.body_as("verification").get("signer") or {}).get("keyid") != kid:
        raise keyring.SigningKeyError(f"{run_id} seq {seq}: the verification record names another signer than key "
                                     f"{kid}; verify again with `marin verify --sign --key` this key")
    kid, _ = publish_key(root, key)
    envelope = dsse.sign(summary(log.stage, rec, kid), key)
    path = envelope_path(root, run_id, kid)
    fsutil.write_bytes(path, (json.dumps(envelope.to_json(), indent=2) + "\n").encode())
    return path


# -- against the ledger ---------------------------------------------------------------------


def backing_problem(v: Vsa, log: RunLog, kid: str, as_of: str) -> str | None:
    """Why a validly signed VSA about ``log``'s run is not backed by the ledger (None: it is). It
    must cite a verification record of that run by seq and digest, be exactly the statement marin
    builds from that record for key ``kid`` (so its result, CPU and time are the record's, never
    the signer's say-so), and the record's time must lie between the run's end and ``as_of`` (the
    report's build)."""
    seq = v.record_seq
    rec = next((r for r in log.records if r.kind == "verification" and r.seq == seq), None)
    if rec is None:
        return (f"it cites verification record seq {seq}, but {log.run_id} has no verification record there: "
                "no `marin verify` it summarises is in the ledger")
    if v.record_digest != rec.digest:
        return f"it cites verification record seq {seq} as {v.record_digest}, the ledger's is {rec.digest}"
    if compared_nothing(rec.body_as("verification")):
        return f"verification record seq {seq} compared no record: it verified nothing"
    signer = (rec.body_as("verification").get("signer") or {}).get("keyid")
    if signer != kid:
        return (f"verification record seq {seq} names " + (f"key {signer} as its signer, not {kid}" if signer else
                "no signer (it was not made by `marin verify --sign`)") + ": whoever signed this did not make it")
    if (where := _first_difference(summary(log.stage, rec, kid).doc, v.statement.doc)) is not None:
        ptr, want_v, got_v = where
        return f"its {ptr} is {_short(got_v)}, but verification record seq {seq} gives {_short(want_v)}"
    if _when(rec.time) < _when(log.end.time):
        return f"verified at {rec.time}, before the run it verifies ended ({log.end.time})"
    if _when(rec.time) > _when(as_of):
        return f"verified at {rec.time}, after the report was built ({as_of})"
    return None


def _first_difference(want: object, got: object, ptr: str = "") -> tuple[str, object, object] | None:
    """The JSON pointer of the first place ``got`` differs from ``want``, with both values there."""
    w, g = want, got  # narrowed below; ``want`` and ``got`` stay what they were for the answer
    if isinstance(w, dict) and isinstance(g, dict):
        wd, gd = cast(dict[str, object], w), cast(dict[str, object], g)
        for k in sorted(set(wd) | set(gd)):
            if (d := _first_difference(wd.get(k), gd.get(k), f"{ptr}/{k}")) is not None:
                return d
        return None
    if isinstance(w, list) and isinstance(g, list) and len(cast(list[object], w)) == len(cast(list[object], g)):
        pairs = zip(cast(list[object], w), cast(list[object], g), strict=True)
        return next((d for i, (a, b) in enumerate(pairs) if (d := _first_difference(a, b, f"{ptr}/{i}")) is not None),
                    None)
    return None if want == got and type(want) is type(got) else (ptr or "/", want, got)


def _short(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _when(ts: str) -> datetime:
    return datetime.fromisoformat(ts)


def files(root: Path) -> list[str]:
    """Every VSA and public key file under verifications/, and the lab's verifiers list, project-relative,
    sorted. A symbolic link is never read: what is committed there is the file itself."""
    base = Path(root) / DIR
    if not base.is_dir():
        return []
    found = [*(p for p in base.glob(f"*/*{SUFFIX}") if p.parent.name != KEYS), *(base / KEYS).glob("*.pub"),
             base / Path(verifiers.FILE).name]
    return sorted(p.relative_to(root).as_posix() for p in found if p.is_file() and not p.is_symlink())


def sign_recorded(root: Path, recorded: list[tuple[str, int]], key: Path | None, as_lab: bool = False) -> list[Path]:
    """``marin verify --sign``: a VSA for each (run id, verification record seq), signed with ``key``
    (else the configured signing key, only ``as_lab``). Without a usable key: a SigningKeyError saying
    how to make one; the verification records stay in the ledger, unsigned."""
    try:
        key = signer_key(root, key, as_lab)
    except keyring.SigningKeyError as e:
        where = ", ".join(f"{r} seq {s}" for r, s in recorded) or "nothing"
        raise keyring.SigningKeyError(f"--sign: {e}; the verification is recorded ({where}) but not signed") from None
    return [sign(root, run_id, seq, key) for run_id, seq in recorded]
