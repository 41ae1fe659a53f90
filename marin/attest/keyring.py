"""Signing keys: ed25519 PEM files (``marin keygen``), their ids (the sha256 hex of the raw 32 public
bytes) and where the lab's key is configured (``$MARIN_SIGNING_KEY``, else ``report.signing_key``)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from marin import fsutil, readers
from marin.config import ReportParams
from marin.errors import MarinError

KEY_ENV = "MARIN_SIGNING_KEY"
_KEYGEN_HINT = "run `marin keygen PATH` to make one"
_KEYID = re.compile(r"[0-9a-f]{64}")


class SigningKeyError(MarinError):
    """A signing or verification key is missing, unreadable, not ed25519, or would be overwritten."""


def keygen(private_path: Path, public_path: Path | None = None) -> tuple[Path, Path]:
    """Write a new ed25519 private key (PEM PKCS8, mode 0600) and its public key (``<private>.pub``)."""
    private_path = Path(private_path)
    public_path = Path(public_path) if public_path is not None else _default_public(private_path)
    for p in (private_path, public_path):
        if p.exists():
            raise SigningKeyError(f"{p}: already exists; marin never overwrites a key: move it away or pick a new path")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write_new_private(private_path, private_pem)
    fsutil.write_bytes(public_path, public_pem(key.public_key()))
    return private_path, public_path


def public_pem(public_key: Ed25519PublicKey) -> bytes:
    """The public key as a PEM (SubjectPublicKeyInfo) file's bytes, as ``keygen`` writes ``<key>.pub``."""
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _default_public(private_path: Path) -> Path:
    return private_path.with_name(private_path.name + ".pub")


def _write_new_private(path: Path, data: bytes) -> None:
    """Create ``path`` with mode 0600 (O_EXCL: fail rather than replace), write, fsync."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise SigningKeyError(f"{path}: already exists; marin never overwrites a key: move it away") from None
    try:
        os.fchmod(fd, 0o600)  # the umask can only narrow the mode; be explicit anyway
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        path.unlink(missing_ok=True)  # never leave a half-written key behind
        raise
    fsutil.fsync_dir(path.parent)


def _read_key_file(path: Path, what: str) -> bytes:
    try:
        return readers.read_bytes(os.path.realpath(path), "key", SigningKeyError)  # a link to a key is fine
    except FileNotFoundError:
        raise SigningKeyError(f"{path}: no such {what} key file; {_KEYGEN_HINT}") from None
    except PermissionError as e:
        raise SigningKeyError(f"{path}: cannot read {what} key ({e.strerror}); check path and permissions") from None


def _not_ed25519(path: Path, key: object) -> SigningKeyError:
    kind = type(key).__name__.lstrip("_")
    return SigningKeyError(f"{path}: a {kind}, but marin keys must be ed25519; {_KEYGEN_HINT}")


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """The ed25519 private key in a PEM file."""
    data = _read_key_file(path, "private")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise SigningKeyError(f"{path}: the key is encrypted; marin needs an unencrypted PKCS8 PEM key") from None
    except (ValueError, UnsupportedAlgorithm) as e:
        raise SigningKeyError(f"{path}: not a PEM private key ({e}); {_KEYGEN_HINT}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise _not_ed25519(path, key)
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """The ed25519 public key in a PEM (SubjectPublicKeyInfo) file."""
    return public_key_from_pem(_read_key_file(path, "public"), Path(path))


def public_key_from_pem(data: bytes, path: Path) -> Ed25519PublicKey:
    """The ed25519 public key in PEM ``data`` (read from ``path``, which messages name)."""
    if b"PRIVATE KEY" in data:
        raise SigningKeyError(f"{path}: a private key; verify with its public key ({_default_public(Path(path))})")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as e:
        raise SigningKeyError(f"{path}: not a PEM public key ({e}); {_KEYGEN_HINT}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise _not_ed25519(path, key)
    return key


def keyid(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """The key id: sha256 hex of the raw 32 public bytes (of a private key: of its public half)."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def is_keyid(text: str) -> bool:
    """Whether ``text`` has the shape of a key id (64 lowercase hex digits)."""
    return _KEYID.fullmatch(text) is not None


def key_path(explicit: str | None, root: Path) -> Path:
    """The signing key: ``explicit`` (report.signing_key), else $MARIN_SIGNING_KEY; relative to ``root``."""
    chosen = explicit or os.environ.get(KEY_ENV)
    if not chosen:
        raise SigningKeyError(
            f"no signing key: set report.signing_key in params.yaml or {KEY_ENV}, or make one with `marin keygen PATH`"
        )
    path = Path(chosen).expanduser()
    return path if path.is_absolute() else Path(root) / path


def signing_key(root: Path, p: ReportParams | None) -> Path:
    """The lab's private key: $MARIN_SIGNING_KEY, else report.signing_key (its public half is ``<key>.pub``)."""
    return key_path(os.environ.get(KEY_ENV) or (p.signing_key if p else None), root)
