"""The guarded Promote dialog: the one way a page moves `production` (the Evaluate page's Promote and the
Library page's Labels both draw it).

It shows what core.records.library.promotion.preview_promotion finds (the experiences that change against
production, as a diff, and the paired comparison's verdict of the two versions' newest evaluations on the
same split and k), asks for a written reason when core's guard needs one (no paired comparison, or one that
finds the candidate worse), and moves the label only on *Confirm*, through core.records.library.versions.promote,
which checks the guard again and records the evidence and the reason in the audit log. With the setting
promotion_requires_comparison on and no comparison, Confirm is disabled and the page says what to do.

Not a page itself (ui/, not pages/); state changes go through `core`.
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st
from sqlmodel import Session

from core.errors import StudioError
from core.records.evaluation.figures import NO_FIGURE, figure
from core.records.library.promotion import PromotionPreview, preview_promotion
from core.records.library.versions import promote
from core.records.production.ab_verdict import running_experiment_note
from ui.common import Flash, context, engine, plain, run_action
from ui.display import show_long
from ui.messages import message_markdown


def show_preview(preview: PromotionPreview, key: str) -> None:
    """What moving the label changes (the experiences, against production) and what the evidence says."""
    current = f"#{preview.production_number}" if preview.production_number is not None else "none"
    st.markdown(f"**Promote version #{preview.version_number} to production?** Production now: {current}.")
    stats = preview.comparison.stats if preview.comparison else None
    shown = st.error if preview.worse else st.success if stats and stats.decided else st.info
    shown(plain(preview.evidence))
    if stats is not None:
        cols = st.columns(3)
        cols[0].metric("Candidate − production (Mean@k)", figure(stats.figure("delta"), "+.3f"))
        cols[1].metric("95% interval", f"[{stats.ci_low:+.3f}, {stats.ci_high:+.3f}]" if stats.n >= 2 else NO_FIGURE)
        cols[2].metric("Queries compared", stats.n)
    if preview.changes:
        count = len(preview.changes)
        st.caption(f"What changes in the agent's prompt: {count} experience{'s' if count != 1 else ''} "
                   "(- production, + candidate)")
        show_long(preview.diff_lines(), key, language="diff")
    elif not preview.already_production:
        st.caption("The experiences are the same as production's.")


@dataclass(frozen=True)
class PromoteDialog:
    """A page's Promote dialog: `prefix` keys its widgets (`{prefix}_promote_confirm`, ...), and its outcome is
    shown by `flash.show(section)`."""

    prefix: str
    flash: Flash
    section: str

    @property
    def pending_key(self) -> str:
        return f"{self.prefix}_promote_pending"

    @property
    def reason_key(self) -> str:
        return f"{self.prefix}_promote_reason"

    def pending(self) -> int | None:
        """The version whose promotion waits for Confirm, if any."""
        return st.session_state.get(self.pending_key)

    def ask(self, version_id: int) -> None:
        """Open the dialog for this version (a button's callback): nothing moves yet."""
        st.session_state[self.pending_key] = version_id
        st.session_state.pop(self.reason_key, None)

    def cancel(self) -> None:
        st.session_state.pop(self.pending_key, None)
        st.session_state.pop(self.reason_key, None)

    def confirm(self, version_id: int, name: str) -> None:
        """Confirm's callback: core.records.library.versions.promote checks the role and the guard again, with the reason
        typed here; a refusal keeps the dialog open (to add a reason) and shows why."""
        reason = st.session_state.get(self.reason_key) or ""
        moved = run_action(self.flash, self.section, promote, engine(), version_id, context().reviewer, reason=reason,
                           report=f"production now points at version {name}"
                                  + ("; the reason is in the audit log." if reason.strip() else "."))
        if moved is not None:
            self.cancel()

    def draw(self, version_id: int, name: str) -> None:
        """The diff, the comparison's verdict, a reason box when the guard needs one, Confirm and Cancel."""
        with st.container(border=True):
            try:
                preview = preview_promotion(engine(), version_id)
            except StudioError as exc:
                st.error(message_markdown(exc))
                return
            show_preview(preview, f"{self.prefix}_promote_changes")
            with Session(engine()) as session:
                note = running_experiment_note(session, preview.task, preview.library, version_id)
            if note:
                st.warning(plain(note))
            if preview.blocked:
                st.warning(f"Production cannot move to this version yet: {message_markdown(preview.refusal())}.")
            elif preview.needs_reason:
                why = ("the comparison finds it worse than production" if preview.worse
                       else "the comparison cannot decide" if preview.undecided
                       else "there is no paired comparison with production")
                st.text_area(f"Reason (required: {why})", key=self.reason_key, height=80,
                             help="Why production should move anyway. Stored with the move in the audit log.")
            confirm, cancel = st.columns(2)
            confirm.button(f"Confirm: promote #{preview.version_number}", key=f"{self.prefix}_promote_confirm",
                           type="primary", on_click=self.confirm, args=(version_id, name), disabled=preview.blocked)
            cancel.button("Cancel", key=f"{self.prefix}_promote_cancel", on_click=self.cancel)
