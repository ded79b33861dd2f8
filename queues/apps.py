from django.apps import AppConfig


class QueuesConfig(AppConfig):
    name = "queues"
    verbose_name = "Merritt queues"

    def ready(self) -> None:
        # The ZooKeeper module imports no Django: it is handed the settings it needs, read
        # afresh for each connection (tests and commands change them at run time).
        from django.conf import settings

        from queues.zk.client import ZkSettings, configure

        configure(
            lambda: ZkSettings(
                hosts=settings.ZK_HOSTS,
                timeout=settings.ZK_TIMEOUT,
                var_dir=settings.MRT_VAR_DIR,
                local_port=settings.ZK_LOCAL_PORT,
            )
        )
