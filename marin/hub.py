"""The Hugging Face Hub's conventions that both the report's cards and the exported models' cards
follow (a module of its own, so that an export stage's code closure holds no report code or data)."""

from __future__ import annotations

# The Hugging Face Hub's licence ids (its documented list, mostly SPDX ids in lower case); others go in as
# "other" with a license_name.
HF_LICENSES = frozenset({
    "apache-2.0", "mit", "openrail", "afl-3.0", "artistic-2.0", "bsl-1.0", "bsd", "bsd-2-clause", "bsd-3-clause",
    "bsd-3-clause-clear", "c-uda", "cc", "cc0-1.0", "cc-by-2.0", "cc-by-2.5", "cc-by-3.0", "cc-by-4.0",
    "cc-by-sa-3.0", "cc-by-sa-4.0", "cc-by-nc-2.0", "cc-by-nc-3.0", "cc-by-nc-4.0", "cc-by-nd-4.0",
    "cc-by-nc-nd-3.0", "cc-by-nc-nd-4.0", "cc-by-nc-sa-2.0", "cc-by-nc-sa-3.0", "cc-by-nc-sa-4.0",
    "cdla-sharing-1.0", "cdla-permissive-1.0", "cdla-permissive-2.0", "wtfpl", "ecl-2.0", "epl-1.0", "epl-2.0",
    "etalab-2.0", "eupl-1.1", "eupl-1.2", "agpl-3.0", "gfdl", "gpl", "gpl-2.0", "gpl-3.0", "lgpl", "lgpl-2.1",
    "lgpl-3.0", "isc", "lppl-1.3c", "ms-pl", "mpl-2.0", "odc-by", "odbl", "osl-3.0", "postgresql", "ofl-1.1",
    "ncsa", "unlicense", "zlib", "pddl", "unknown", "other"})


def hf_license(spdx: str) -> str:
    """The Hub's id of an SPDX licence, or "other"."""
    lic = str(spdx).lower()
    return lic if lic in HF_LICENSES else "other"
