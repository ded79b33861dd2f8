"""Every list page names the live topics it shows, so open pages refresh when ZooKeeper moves."""

import io

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command


@pytest.fixture
def viewer(client, db, zk):
    call_command("setupconsole", stdout=io.StringIO())
    user = User.objects.create_user("watcher", password="pw-123456789")
    user.groups.add(Group.objects.get(name="viewer"))
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    ("url", "element", "topic"),
    [
        ("/batches/", "batch-table", "batches"),
        ("/failed/", "failed-live", "jobs:state:Failed"),
        ("/holds/", "holds-panel", "holds"),
        ("/access/", "access-table", "access:small"),
        ("/reports/", "reports-live", "batches"),
        ("/jobs/?state=Pending", "job-table", "jobs:state:Pending"),
    ],
)
def test_list_page_refreshes_itself_on_its_live_topics(viewer, url, element, topic):
    html = viewer.get(url).content.decode()
    start = html.index(f'id="{element}"')
    tag = html[html.rindex("<", 0, start) : html.index(">", start)]
    assert topic in tag.split('data-live="')[1].split('"')[0].split()
    assert 'hx-trigger="live-refresh"' in tag
    assert f'hx-select="#{element}"' in tag
