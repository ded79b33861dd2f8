"""Console URLs. Every ID in a path is matched by its exact pattern (the zk validators check
again before any ZooKeeper path is built)."""

from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path

from queues.views import (
    access,
    alerts,
    audit,
    batches,
    bulk,
    causes,
    cockpit,
    consistency,
    failed,
    fixed,
    holds,
    jobs,
    overview,
    priorities,
    reports,
    tokens,
    workers,
)
from queues.web import api, metrics
from queues.web.routes import (
    ACCESS_ACTION,
    BATCH_ACTION,
    BID,
    HOLD_ACTION,
    JID,
    JOB_ACTION,
    NODE,
    PROFILE,
    QID,
    QUEUE_HOLD,
    SERVICE,
)

urlpatterns = [
    path("", overview.overview, name="overview"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("health/zk/", overview.zk_health, name="zk-health"),
    path("jobs/", jobs.jobs, name="jobs"),
    path("jobs/bulk/", bulk.jobs_bulk, name="jobs-bulk"),
    re_path(rf"^jobs/{JID}/$", jobs.job, name="job"),
    re_path(
        rf"^jobs/{JID}/{JOB_ACTION}/$",
        jobs.job_action,
        name="job-action",
    ),
    path("batches/", batches.batches, name="batches"),
    path("batches/bulk/", bulk.batches_bulk, name="batches-bulk"),
    path("batches/fixed/", fixed.fixed_batches, name="fixed-batches"),
    re_path(rf"^batches/{BID}/$", batches.batch, name="batch"),
    re_path(
        rf"^batches/{BID}/{BATCH_ACTION}/$",
        batches.batch_action,
        name="batch-action",
    ),
    path("failed/", failed.failed, name="failed"),
    path("failed/bulk/", bulk.failed_bulk, name="failed-bulk"),
    path("failed/causes/", causes.failed_causes, name="failed-causes"),
    path("failed/causes/bulk/", bulk.failed_cause_bulk, name="failed-causes-bulk"),
    path("bulk/", bulk.bulk_runs, name="bulk-runs"),
    path("bulk/<int:pk>/", bulk.bulk_run, name="bulk-run"),
    re_path(
        r"^bulk/(?P<pk>[0-9]{1,18})/(?P<verb>stop|continue)/$",
        bulk.bulk_run_control,
        name="bulk-run-control",
    ),
    path("reports/", reports.reports, name="reports"),
    re_path(rf"^reports/{BID}\.(?P<fmt>csv|json)$", reports.report_export, name="report-export"),
    path("search/", cockpit.search, name="search"),
    path("holds/", holds.holds, name="holds"),
    re_path(
        rf"^holds/queue/{QUEUE_HOLD}/{HOLD_ACTION}/$",
        holds.queue_hold_action,
        name="queue-hold",
    ),
    path("holds/collection/", holds.collection_hold_new, name="collection-hold-new"),
    path("holds/node/", holds.node_hold_new, name="node-hold-new"),
    path("holds/node-failed/", holds.node_failed, name="node-failed"),
    path("holds/service/", holds.service_hold_new, name="service-hold-new"),
    re_path(
        rf"^holds/service/{SERVICE}/{HOLD_ACTION}/$",
        holds.service_hold_action,
        name="service-hold",
    ),
    re_path(
        rf"^holds/node/{NODE}/{HOLD_ACTION}/$",
        holds.node_hold_action,
        name="node-hold",
    ),
    re_path(
        rf"^holds/collection/{PROFILE}/{HOLD_ACTION}/$",
        holds.collection_hold_action,
        name="collection-hold",
    ),
    path("access/", access.access, name="access"),
    re_path(rf"^access/{QID}/{ACCESS_ACTION}/$", access.access_action, name="access-action"),
    path("consistency/", consistency.consistency, name="consistency"),
    path("consistency/repair/", consistency.consistency_repair, name="consistency-repair"),
    path("submit/", batches.submit, name="submit"),
    path("audit/", audit.audit, name="audit"),
    path("tokens/", tokens.tokens, name="tokens"),
    path("tokens/new/", tokens.token_create, name="token-create"),
    path("tokens/<int:pk>/revoke/", tokens.token_revoke, name="token-revoke"),
    # Consumers, step history, stuck jobs (queues/views/workers.py)
    path("consumers/", workers.consumers, name="consumers"),
    re_path(
        r"^consumers/(?P<name>[A-Za-z0-9_.-]{1,200})/(?P<verb>drain|undrain)/$",
        workers.consumer_drain,
        name="consumer-drain",
    ),
    path("history/", workers.history_page, name="history"),
    path("stuck/", workers.stuck_jobs, name="stuck"),
    # Alerts: the rules, their firings and a test alert (queues/views/alerts.py)
    path("alerts/", alerts.alerts, name="alerts"),
    path("alerts/test/", alerts.alert_test, name="alert-test"),
    re_path(
        r"^alerts/rules/(?P<kind>[a-z0-9-]{1,40})/$", alerts.alert_rule_update, name="alert-rule"
    ),
    # Priorities and caps: a job's, a batch's, a collection's (queues/views/priorities.py)
    path("collections/", priorities.collections, name="collections"),
    re_path(rf"^collections/{PROFILE}/$", priorities.collection, name="collection"),
    re_path(
        rf"^collections/{PROFILE}/priority/$",
        priorities.collection_priority,
        name="collection-priority",
    ),
    re_path(rf"^batches/{BID}/priority/$", priorities.batch_priority, name="batch-priority"),
    re_path(rf"^jobs/{JID}/priority/$", priorities.job_priority, name="job-priority"),
    re_path(
        rf"^holds/collection/{PROFILE}/{priorities.CAP_ACTION}/$",
        priorities.collection_cap_action,
        name="collection-cap",
    ),
    path("api/", include(priorities.api_urlpatterns)),
    path("notes/", include("queues.views.notes")),
    path("metrics", metrics.metrics, name="metrics"),
    path("api/", include(api.urlpatterns)),
    # Merritt ingest's depositor door: POST /poster/submit|update (queues/views/poster.py)
    path("poster/", include("queues.views.poster")),
]
