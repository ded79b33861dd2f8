"""Forms: filters, action inputs and the submit form. IDs are checked by the zk validators."""

from __future__ import annotations

from datetime import date, datetime, time
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.http import QueryDict

from queues.console import batch_reads, job_reads
from queues.core import clock
from queues.core.states import ACCESS, BATCH, JOB
from queues.core.words import VERSION_MOST, digits, yes_or_no
from queues.services.moves import SUBMISSION_TYPES, check_payload_url
from queues.steps.checkm import HASH_LENGTHS
from queues.steps.submission import submission_problems
from queues.zk import paths as zpaths
from queues.zk.errors import InvalidID
from queues.zk.maintenance import node_number, service_key

# The largest page number a list answers: a million pages of 20 rows is 20 million items, more
# than any queue holds; past it a number is refused, not handed to an SQL OFFSET or a slice.
MAX_PAGE = 1_000_000


def errors_text(form: forms.Form) -> str:
    """A form's errors as ``errors.as_text()`` writes them ("* field" and its "  * message"
    lines), the messages as they are: Django's text escapes them for HTML, and a refusal's words
    are escaped where they go (a page's template, JSON), so a quote reached the API's answer as
    ``&#x27;`` and a page as ``&amp;#x27;``."""
    lines: list[str] = []
    for field, messages in form.errors.items():
        lines.append(f"* {field}")
        lines.extend(f"  * {message}" for message in messages)
    return "\n".join(lines)


def whole_number(query: Any, name: str = "page", *, default: int = 1, most: int = MAX_PAGE) -> int:
    """The number ``name`` of a query (``default`` when absent or empty), a page's number by
    default: a whole number from 1 to ``most``, else ValueError saying so (a 400 from every
    door). Digits only, ASCII only: ``int`` would take "²" no more than an SQL OFFSET takes
    23 digits."""
    number = digits(query.get(name) or str(default), len(str(most)))
    if number is not None and 1 <= number <= most:
        return number
    raise ValueError(f"{name} must be a whole number from 1 to {most:,}")


class YesNoInput(forms.CheckboxInput):
    """A checkbox whose posted text goes to its field as it came (``YesNoField`` reads it),
    shown ticked when that text says yes."""

    def __init__(self, attrs: dict[str, Any] | None = None) -> None:
        super().__init__(attrs, check_test=_says_yes)

    def value_from_datadict(self, data: Any, files: Any, name: str) -> Any:
        return data.get(name)


def _says_yes(value: Any) -> bool:
    return value is True or (isinstance(value, str) and yes_or_no(value) is True)


class YesNoField(forms.BooleanField):
    """Yes or no: true/false, 1/0, yes/no, on/off (a checkbox posts "on" or its value), absent
    for no; any other text is refused. Django's BooleanField takes any text but "false" and "0"
    for yes: ``?stuck=no`` listed the stuck jobs only, ``release_jobs=x`` released too."""

    widget = YesNoInput

    def to_python(self, value: Any) -> bool:
        if value is None or isinstance(value, bool):
            return bool(value)
        answer = yes_or_no(str(value))
        if answer is None:
            raise ValidationError(f"must be true or false, got {str(value)[:40]!r}", "invalid")
        return answer


class WholeNumberField(forms.IntegerField):
    """A whole number in ASCII digits (or a JSON integer), within the field's
    bounds. Django's IntegerField reads any script's digits ("٣" is 3) and "1.0" as 1."""

    def to_python(self, value: Any) -> int | None:
        if value in self.empty_values:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value).strip()
        number = digits(text[1:]) if text.startswith("-") else digits(text)
        if number is None:
            raise ValidationError(self.error_messages["invalid"], code="invalid")
        return -number if text.startswith("-") else number


class LocalTimeField(forms.DateTimeField):
    """A date and time an operator gives, read as the console writes times
    (``queues.core.clock.given_time``): in the console's zone, or with the zone's name
    (``2026-11-01 01:30 PST``) or an offset. Django's field refused a local time the clocks skip
    or show twice in one sentence for both ("may be ambiguous or may not exist") and took no
    zone name, so the hour the clocks go back could not be given at all from a page."""

    def to_python(self, value: Any) -> datetime | None:
        if value in self.empty_values:
            return None
        try:
            if isinstance(value, datetime):
                return clock.local_time(value) if value.utcoffset() is None else value
            if isinstance(value, date):
                return clock.local_time(datetime.combine(value, time.min))
            if isinstance(value, str):
                moment = clock.given_time(value)
                if moment is not None:
                    return moment
                for form in self.input_formats or ():  # Django's other forms (``11/25/2026 10:04``)
                    try:
                        naive = self.strptime(value.strip(), form)
                    except (ValueError, TypeError):
                        continue
                    return clock.local_time(naive)
        except ValueError as exc:
            raise ValidationError(str(exc), code="invalid") from exc
        raise ValidationError(self.error_messages["invalid"], code="invalid")


def _validated(validator: Any, value: str) -> str:
    try:
        return validator(value)
    except InvalidID as exc:
        raise ValidationError(str(exc)) from exc


def _choices(states: tuple[str, ...], blank: str) -> list[tuple[str, str]]:
    return [("", blank), *((s, s) for s in states)]


class JobFilterForm(forms.Form):
    state = forms.ChoiceField(
        # Deleted too: Merritt's library leaves deleted jobs in place for an admin to remove.
        choices=_choices(JOB.states, "any state"),
        required=False,
    )
    profile = forms.CharField(required=False, max_length=100, label="Collection (profile)")
    bid = forms.CharField(required=False, max_length=13, label="Batch")
    submitter = forms.CharField(required=False, max_length=200)
    min_age_hours = forms.FloatField(required=False, min_value=0, label="In state at least (hours)")
    priority = WholeNumberField(required=False, min_value=0, max_value=99)
    q = forms.CharField(required=False, max_length=300, label="Search job/batch ID, ARK, local ID")
    sort = forms.ChoiceField(choices=list(job_reads.JOB_SORTS.items()), required=False)
    stuck = YesNoField(required=False, label="Stuck only")
    page = WholeNumberField(required=False, min_value=1, max_value=MAX_PAGE)

    def clean_profile(self) -> str:
        value = self.cleaned_data["profile"].strip()
        return _validated(zpaths.profile, value) if value else ""

    def clean_bid(self) -> str:
        value = self.cleaned_data["bid"].strip()
        return _validated(zpaths.bid, value) if value else ""

    def clean_q(self) -> str:
        return self.cleaned_data["q"].strip()

    def narrows(self) -> bool:
        """Whether the (valid) filter leaves any job out: a bulk action over a filter that
        does not is over every job, which a request must ask for in words."""
        data = self.cleaned_data
        return bool(
            any(data[k] for k in ("state", "profile", "bid", "submitter", "q", "stuck"))
            or (data["min_age_hours"] or 0) > 0
            or data["priority"] is not None
        )

    def to_filter(self) -> job_reads.JobFilter:
        data = self.cleaned_data
        q, bid = data["q"], data["bid"]
        if zpaths.BID_RE.fullmatch(q):  # a batch ID in the search box filters by batch
            q, bid = "", q
        return job_reads.JobFilter(
            state=data["state"],
            profile=data["profile"],
            bid=bid,
            submitter=data["submitter"].strip(),
            min_age_hours=data["min_age_hours"],
            priority=data["priority"],
            q=q,
            sort=data["sort"] or "run",
            stuck=bool(data.get("stuck")),
        )


class BatchFilterForm(forms.Form):
    state = forms.ChoiceField(choices=_choices(BATCH.states, "any state"), required=False)
    profile = forms.CharField(required=False, max_length=100)
    submitter = forms.CharField(required=False, max_length=200)
    q = forms.CharField(required=False, max_length=300, label="Batch ID, UUID or title")
    page = WholeNumberField(required=False, min_value=1, max_value=MAX_PAGE)

    def clean_profile(self) -> str:
        value = self.cleaned_data["profile"].strip()
        return _validated(zpaths.profile, value) if value else ""

    def to_filter(self) -> batch_reads.BatchFilter:
        data = self.cleaned_data
        return batch_reads.BatchFilter(
            state=data["state"],
            profile=data["profile"],
            submitter=data["submitter"].strip(),
            q=data["q"].strip(),
        )


class FailedFilterForm(forms.Form):
    bid = forms.CharField(required=False, max_length=13, label="Batch")
    profile = forms.CharField(required=False, max_length=100, label="Collection")
    step = forms.ChoiceField(choices=_choices(JOB.states, "any step"), required=False)

    def narrows(self) -> bool:
        """Whether the (valid) filter leaves any failed job out (see JobFilterForm.narrows)."""
        return any(self.cleaned_data[k] for k in ("bid", "profile", "step"))

    def clean_bid(self) -> str:
        value = self.cleaned_data["bid"].strip()
        return _validated(zpaths.bid, value) if value else ""

    def clean_profile(self) -> str:
        value = self.cleaned_data["profile"].strip()
        return _validated(zpaths.profile, value) if value else ""


class AccessFilterForm(forms.Form):
    queue = forms.ChoiceField(
        choices=[("", "both queues"), *((q, q) for q in zpaths.ACCESS_QUEUES)], required=False
    )
    state = forms.ChoiceField(choices=_choices(ACCESS.states, "any state"), required=False)


_RESUME_TARGETS = [
    (s, s)
    for s in dict.fromkeys(
        t
        for machine in (JOB, ACCESS)
        for source in machine.action_sources("resume")
        for t in machine.action_targets("resume", source)
    )
]


class ActionForm(forms.Form):
    """The fields every action POST may carry."""

    version = WholeNumberField(required=False, min_value=0, max_value=VERSION_MOST)
    reason = forms.CharField(required=False, max_length=2000)
    # Where a resume goes: a job's step or an access request's state, any the state machines
    # resume to (the service then checks it against the item: a job only to a step it reached).
    to = forms.ChoiceField(required=False, choices=[("", ""), *_RESUME_TARGETS])
    release_jobs = YesNoField(required=False)
    # A hold's maintenance window: released by itself at this time (ISO-8601 or the console's
    # written form; without an offset or zone name, the console's time zone: LocalTimeField).
    until = LocalTimeField(required=False)
    # The posted field is named "render" (htmx asks for a row or a panel back); as a form
    # attribute it shadows Form.render, which this form never uses.
    render = forms.ChoiceField(  # type: ignore[assignment]
        required=False, choices=[("", ""), ("row", "row"), ("panel", "panel")]
    )
    next = forms.CharField(required=False, max_length=2000)


class BulkForm(forms.Form):
    """A bulk action: over the ticked items, or over everything the filter matches now."""

    action = forms.CharField(max_length=40)
    scope = forms.ChoiceField(choices=[("selection", "selection"), ("filter", "filter")])
    item = forms.MultipleChoiceField(required=False)  # "jid:version" pairs, checked in clean
    reason = forms.CharField(required=False, max_length=2000)
    to = forms.ChoiceField(required=False, choices=[("", ""), *_RESUME_TARGETS])  # resume's step
    confirmed = YesNoField(required=False)

    def __init__(self, *args: Any, id_validator: Any = zpaths.jid, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.id_validator = id_validator
        # Any value may be posted; clean_item validates each one instead of a fixed choice list.
        posted = self.data.getlist("item") if isinstance(self.data, QueryDict) else []
        item_field = self.fields["item"]
        assert isinstance(item_field, forms.MultipleChoiceField)
        item_field.choices = [(v, v) for v in posted]

    def clean_item(self) -> list[tuple[str, int | None]]:
        """Each item once (a repeat would be acted on and then skipped: a refusal, not a run),
        with the version seen, if any: a whole number ZooKeeper could have given it."""
        items: dict[str, int | None] = {}
        for raw in self.cleaned_data["item"]:
            item_id, _, version = raw.partition(":")
            _validated(self.id_validator, item_id)
            number = digits(version)
            if version and (number is None or number > VERSION_MOST):
                raise ValidationError(
                    f"bad version in {raw[:60]}: a whole number from 0 to {VERSION_MOST:,}"
                )
            if item_id in items:
                raise ValidationError(f"{item_id} is listed twice: list each item once")
            items[item_id] = number
        return list(items.items())


class CollectionHoldForm(forms.Form):
    profile = forms.CharField(max_length=100, label="Collection (profile)")
    reason = forms.CharField(required=False, max_length=2000)
    until = LocalTimeField(required=False)

    def clean_profile(self) -> str:
        return _validated(zpaths.profile, self.cleaned_data["profile"].strip())


class NodeFailuresForm(forms.Form):
    """Which failures "resume what failed on node N between T1 and T2" looks for."""

    node = forms.CharField(max_length=9, label="Storage node")
    since = LocalTimeField(label="Failed after")
    before = LocalTimeField(label="and before")

    def clean_node(self) -> int:
        return int(_validated(node_number, self.cleaned_data["node"].strip()))

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        since, before = data.get("since"), data.get("before")
        if since and before and since >= before:
            raise ValidationError("the window must start before it ends")
        return data


class NodeHoldForm(forms.Form):
    node = forms.CharField(max_length=9, label="Storage node")
    reason = forms.CharField(max_length=2000)
    until = LocalTimeField(required=False)

    def clean_node(self) -> str:
        return str(_validated(node_number, self.cleaned_data["node"].strip()))


class ServiceHoldForm(forms.Form):
    service = forms.CharField(max_length=120, label="Service")
    reason = forms.CharField(max_length=2000)
    # Read as every hold's, so that a service's hold refuses an end (it is released by hand) as
    # its URL form and the API do, rather than leave it out.
    until = LocalTimeField(required=False)

    def clean_service(self) -> str:
        return str(_validated(service_key, self.cleaned_data["service"]))


class SubmitForm(forms.Form):
    profile = forms.CharField(max_length=100)
    submitter = forms.CharField(max_length=200)
    payload_url = forms.CharField(max_length=2000, label="Payload URL")
    submission_type = forms.ChoiceField(
        choices=[(t, t) for t in SUBMISSION_TYPES], label="Type", initial="file"
    )
    title = forms.CharField(required=False, max_length=500)
    creator = forms.CharField(required=False, max_length=500)
    date = forms.CharField(required=False, max_length=100)
    local_id = forms.CharField(required=False, max_length=300, label="Local ID")
    primary_id = forms.CharField(required=False, max_length=300, label="Primary ID (ARK)")
    digest_alg = forms.ChoiceField(
        required=False,
        choices=[("", "none"), *((alg, alg) for alg in HASH_LENGTHS)],
        label="Digest algorithm",
    )
    digest_value = forms.CharField(required=False, max_length=200, label="Digest")
    filename = forms.CharField(required=False, max_length=500)

    def clean_profile(self) -> str:
        return _validated(zpaths.profile, self.cleaned_data["profile"].strip())

    def clean_payload_url(self) -> str:
        value = self.cleaned_data["payload_url"].strip()
        try:
            check_payload_url(value)
        except ValueError as exc:
            raise ValidationError(str(exc)) from exc
        return value

    def clean(self) -> dict[str, Any]:
        """The rules every door shares (``steps.submission.submission_problems``), each
        refusal on the field it names; a field already refused is not looked at again."""
        data = super().clean() or {}
        for name, problem in submission_problems(data).items():
            if name in data:
                self.add_error(name, problem)
        return data


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100)
