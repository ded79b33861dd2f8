"""The queue's core, which everything else depends on and which imports nothing of the
project: the three state machines and the roles as data (``states``, ``roles``), one
written form of a time (``clock``), which errors an outage causes (``transient``: the
database, the disk; ``retries``: a service outside, its retry policies and a job's next
try), outside text escaped for where it goes (``outside_text``) and the values the
deployment settings may take (``deployment``).
"""
