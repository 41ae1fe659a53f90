"""The values params.yaml ships in ``report`` as examples: a release must replace them. The report
stage lists those left as warnings; ``marin report verify --release`` refuses a report that has them."""

from __future__ import annotations

from typing import Any

PLACEHOLDER_AUTHORS = ("marin contributors",)
PLACEHOLDER_DOMAIN = "marin.local"  # the shipped contact's domain (maintainers@marin.local)


def placeholders(meta: dict[str, Any]) -> list[str]:
    """One line per placeholder in a report's ``meta`` (params.yaml: report), naming the key and what to do."""
    out = []
    if tuple(meta.get("authors") or ()) in ((), PLACEHOLDER_AUTHORS):
        out.append(f"report.authors is {list(meta.get('authors') or [])!r}, the shipped placeholder: name the people "
                   "who made the model")
    contact = meta.get("contact") or ""
    if not contact or contact.rsplit("@", 1)[-1].endswith(PLACEHOLDER_DOMAIN):
        out.append(f"report.contact is {contact or 'empty'!r}, not an address that reaches anyone: give yours")
    if not meta.get("url"):
        out.append("report.url is null: give the address where the model and its report are published")
    return out
