"""The console's reads: what the pages, the API and the metrics show, from the read
index, ZooKeeper, the archive and the database: the overview and the smaller pages
(``selectors``), the job, failed-job and batch lists and pages (``job_reads``,
``failed_reads``, ``batch_reads``), the search and its text table (``search``,
``jobtext``), why jobs wait and the backlog's forecast (``waits``, ``backlog``),
failure causes, notes on jobs and the state diagrams. Imports the operator's tools and
everything below them; never the daemons or the web.
"""
