"""Forms of the run pages: a person's feedback on a step."""

from __future__ import annotations

from django import forms

from apps.ade.forms.base import AdeForm
from apps.agents.models import Step

FEEDBACK_REFUSED = "Feedback is 'positive' or 'negative'."


class StepFeedbackForm(AdeForm):
    feedback = forms.ChoiceField(
        choices=Step.Feedback.choices,
        error_messages={"required": FEEDBACK_REFUSED, "invalid_choice": FEEDBACK_REFUSED},
    )
