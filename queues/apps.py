from django.apps import AppConfig


class QueuesConfig(AppConfig):
    name = "queues"
    verbose_name = "Merritt queues"
