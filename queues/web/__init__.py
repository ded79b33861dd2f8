"""The web's doors beside the page views (``queues.views``): the JSON API (``api``, its
endpoints; ``api_door``, what every endpoint goes through), ``/metrics``, the forms,
the downloads, ``/healthz`` and the favicon (``health``), the Content-Security-Policy
(``security``), the URL pieces of the routes (``routes``) and the web worker's warm-up
of the read index (``warmup``).
"""
