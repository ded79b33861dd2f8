"""The ZooKeeper service module: the only package that imports kazoo.

Submodules: ``paths`` and ``codecs`` (the contract), ``records`` (what is read), ``jobs``,
``batches``, ``access`` and ``locks`` (reads and writes of each kind of node), ``tree`` (dumps),
``client`` (one client per process, handed its settings), ``watch`` (watches), ``index`` (the
read index), ``errors`` (the domain errors). The package itself exports nothing: each name is
imported from the module that defines it. Not here: the consistency check
(``queues.operator.check``), the project's own ZooKeeper server (``queues.services.zkserver``), the
benchmark loader (``bench.loader``).
"""
