"""The operator's tools: who may do what and the catalogue of actions (``auth``,
``catalogue``), audited actions and bulk runs of them (``actions``, ``audit``,
``bulkrun``), the archive of jobs gone from ZooKeeper, stuck jobs and the step history
(``archive``, ``stuck``, ``history``), and the consistency check, what it finds, its
repairs and its runs (``check``, ``check_findings``, ``check_repairs``,
``consistency``). Imports the services, the ZooKeeper contract and the core; never
the console's reads, the daemons or the web.
"""
