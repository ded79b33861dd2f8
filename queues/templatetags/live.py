"""Template tags naming the live topics a page element shows (see static/js/live.js)."""

from __future__ import annotations

from django import template

from queues.core.states import JOB
from queues.zk.watch import FIXED_TOPICS, job_state_topic

register = template.Library()


@register.simple_tag
def overview_topics() -> str:
    """Everything the overview counts: every job state folder, batches, holds, access queues."""
    return " ".join(FIXED_TOPICS)


@register.simple_tag
def job_state_topics(state: str = "") -> str:
    """A job list's topics: its state's folder, or every state's when it lists them all."""
    if state and JOB.is_state(state):
        return job_state_topic(state)
    return " ".join(job_state_topic(s) for s in JOB.states)
