"""Who approved a champion, and when: the review tags on MLflow model versions (pure; the
registry calls are in :mod:`.mlflow_registry`).

A version's ``kale.review`` says how it got where it is:

- ``pending``: held for review (the challenger did not win, or auto-promotion is off);
- ``promoted``: the retrain/refit promoted it automatically (``kale.approved_by`` names the DAG's
  ``auto_promote``);
- ``approved``: a reviewer ran ``kale promote`` (``kale.approved_by`` is the ``--by`` name);
- ``approved-manually``: the ``champion`` alias was moved outside Kale (the MLflow UI), which
  MLflow does not attribute to anyone; the autoscaler noticed it and tagged it, with
  ``kale.approved_at`` the time it noticed.

The champion it replaced keeps its own ``kale.review`` and gets ``kale.superseded_by`` (the new
version) and ``kale.superseded_at``, which are removed if it becomes champion again.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

REVIEW_TAG = "kale.review"
PENDING, PROMOTED, APPROVED, APPROVED_MANUALLY = "pending", "promoted", "approved", "approved-manually"
APPROVALS = (PROMOTED, APPROVED, APPROVED_MANUALLY)
APPROVED_BY, APPROVED_AT = "kale.approved_by", "kale.approved_at"
SUPERSEDED_BY, SUPERSEDED_AT = "kale.superseded_by", "kale.superseded_at"
AUTO_APPROVER = "auto_promote"
MANUAL_APPROVER = "unknown (the champion alias was moved outside kale, e.g. in the MLflow UI)"


def iso(now: float) -> str:
    """``now`` (seconds since the epoch) as the ISO 8601 UTC time the tags carry."""
    return datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds")


def moved_by_hand(tags: Mapping[str, str]) -> bool:
    """Whether a *champion* with these tags became champion without Kale approving it: it is
    still pending or untagged, or it carries ``kale.superseded_by`` (it was replaced, then
    the alias was moved back to it)."""
    return tags.get(REVIEW_TAG) not in APPROVALS or SUPERSEDED_BY in tags


def approval_tags(review: str, by: str, at: str) -> dict[str, str]:
    """The tags that record an approval (``review`` one of :data:`APPROVALS`)."""
    if review not in APPROVALS:
        raise ValueError(f"{review!r} is no approval; expected one of {', '.join(APPROVALS)}")
    return {REVIEW_TAG: review, APPROVED_BY: by, APPROVED_AT: at}


def superseded_tags(new_version: str, at: str) -> dict[str, str]:
    """The tags that mark the champion ``new_version`` replaced."""
    return {SUPERSEDED_BY: str(new_version), SUPERSEDED_AT: at}


def format_metric(value) -> str:
    """A metric as the version's description shows it: floats to 4 significant digits
    (``0.8736``, ``1.235e+04``), anything else as it is."""
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):  # numpy floats too
        return f"{float(value):.4g}"
    return str(value)


@dataclass(frozen=True)
class Promotion:
    """What ``kale promote`` did: ``version`` of ``model`` is champion, approved by ``by`` at
    ``at``; ``previous`` is the champion it replaced (None: there was none)."""

    model: str
    version: str
    previous: str | None
    by: str
    at: str

    @property
    def already_champion(self) -> bool:
        """The version was champion before (only the approval was recorded)."""
        return self.previous == self.version

    def describe(self) -> str:
        """One sentence for the command's output."""
        if self.already_champion:
            return (f"{self.model} v{self.version} was already the champion; recorded its approval by {self.by} "
                    f"at {self.at}")
        replaced = f"v{self.previous} is tagged superseded" if self.previous else "there was no champion before"
        return f"{self.model} v{self.version} is now the champion, approved by {self.by} at {self.at}; {replaced}"
