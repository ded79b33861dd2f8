from django.apps import AppConfig


class QueuesConfig(AppConfig):
    name = "queues"
    verbose_name = "Merritt queues"

    def ready(self) -> None:
        # The ZooKeeper module imports no Django: it is handed the settings it needs, read
        # afresh for each connection (tests and commands change them at run time).
        from django.conf import settings

        # ZK_HOSTS=local (or empty, while it runs) is the project's own server: the launcher
        # lives here, above the contract, which only ever sees a connection string.
        from queues.services import zkserver
        from queues.zk.client import ZkSettings, configure

        configure(
            lambda: ZkSettings(hosts=settings.ZK_HOSTS, timeout=settings.ZK_TIMEOUT),
            resolve_hosts=lambda hosts: zkserver.resolve_hosts(
                hosts, settings.MRT_VAR_DIR, settings.ZK_LOCAL_PORT
            ),
        )
        # Every read index hands what it reads of a job to the search's text index in the
        # database from its first read on (the writer starts with the web process's fill).
        # The failed causes take the Failed jobs' statuses the index reads likewise.
        from queues.console import failure_causes, jobtext
        from queues.zk import index as zindex

        zindex.NEW_INDEX_HOOKS += [jobtext.attach, failure_causes.attach]
