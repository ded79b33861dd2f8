"""Console URLs. Every ID in a path is matched by its exact pattern (the zk validators check
again before any ZooKeeper path is built)."""

from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path

from queues import api, metrics
from queues.routes import (
    ACCESS_ACTION,
    BATCH_ACTION,
    BID,
    HOLD_ACTION,
    JID,
    JOB_ACTION,
    PROFILE,
    QID,
    QUEUE_HOLD,
)
from queues.views import cockpit, pages, workers, writes

urlpatterns = [
    path("", pages.overview, name="overview"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("health/zk/", pages.zk_health, name="zk-health"),
    path("jobs/", pages.jobs, name="jobs"),
    path("jobs/bulk/", writes.jobs_bulk, name="jobs-bulk"),
    re_path(rf"^jobs/{JID}/$", pages.job, name="job"),
    re_path(
        rf"^jobs/{JID}/{JOB_ACTION}/$",
        writes.job_action,
        name="job-action",
    ),
    path("batches/", pages.batches, name="batches"),
    path("batches/bulk/", writes.batches_bulk, name="batches-bulk"),
    re_path(rf"^batches/{BID}/$", pages.batch, name="batch"),
    re_path(
        rf"^batches/{BID}/{BATCH_ACTION}/$",
        writes.batch_action,
        name="batch-action",
    ),
    path("failed/", pages.failed, name="failed"),
    path("failed/bulk/", writes.failed_bulk, name="failed-bulk"),
    path("bulk/", pages.bulk_runs, name="bulk-runs"),
    path("bulk/<int:pk>/", pages.bulk_run, name="bulk-run"),
    re_path(
        r"^bulk/(?P<pk>[0-9]{1,18})/(?P<verb>stop|continue)/$",
        writes.bulk_run_control,
        name="bulk-run-control",
    ),
    path("reports/", pages.reports, name="reports"),
    re_path(rf"^reports/{BID}\.(?P<fmt>csv|json)$", cockpit.report_export, name="report-export"),
    path("search/", cockpit.search, name="search"),
    path("holds/", pages.holds, name="holds"),
    re_path(
        rf"^holds/queue/{QUEUE_HOLD}/{HOLD_ACTION}/$",
        writes.queue_hold_action,
        name="queue-hold",
    ),
    path("holds/collection/", writes.collection_hold_new, name="collection-hold-new"),
    re_path(
        rf"^holds/collection/{PROFILE}/{HOLD_ACTION}/$",
        writes.collection_hold_action,
        name="collection-hold",
    ),
    path("access/", pages.access, name="access"),
    re_path(rf"^access/{QID}/{ACCESS_ACTION}/$", writes.access_action, name="access-action"),
    path("consistency/", pages.consistency, name="consistency"),
    path("consistency/repair/", writes.consistency_repair, name="consistency-repair"),
    path("submit/", writes.submit, name="submit"),
    path("audit/", pages.audit, name="audit"),
    path("tokens/", pages.tokens, name="tokens"),
    path("tokens/new/", writes.token_create, name="token-create"),
    path("tokens/<int:pk>/revoke/", writes.token_revoke, name="token-revoke"),
    # Consumers, step history, stuck jobs (queues/views/workers.py)
    path("consumers/", workers.consumers, name="consumers"),
    re_path(
        r"^consumers/(?P<name>[A-Za-z0-9_.-]{1,200})/(?P<verb>drain|undrain)/$",
        workers.consumer_drain,
        name="consumer-drain",
    ),
    path("history/", workers.history_page, name="history"),
    path("stuck/", workers.stuck_jobs, name="stuck"),
    path("metrics", metrics.metrics, name="metrics"),
    path("api/", include(api.urlpatterns)),
    # Merritt ingest's depositor door: POST /poster/submit|update (queues/views/poster.py)
    path("poster/", include("queues.views.poster")),
]
