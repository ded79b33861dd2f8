"""The consumer daemons: ``manage.py runconsumer NAME`` (or ``all``) works the ZooKeeper queues.

==========================  ===============  =====================================================
name                        works on         does
==========================  ===============  =====================================================
batch-pending               Pending batches  holds -> Held; else one job per object of the payload
pending                     Pending jobs     collection hold -> Held; corrupt or mismatching
                                             object manifest -> Failed for good; else Estimating
estimating                  Estimating       HEAD every file -> space_needed (never fails)
provisioning                Provisioning     waits below the disk high-water mark
downloading                 Downloading      GET every file, check digests, unpack containers
processing                  Processing       ARK (minted once), ERC, Dublin Core, storage manifest
storing                     Storing          storage adds a version (per-object lock)
recording                   Recording        inventory records the version
notify                      Notify           profile callback -> Completed, folder removed
batch-reporting             Reporting        status report + summary mail -> Completed | Failed
batch-update-reporting      UpdateReporting  report of what changed -> Completed | Failed
access-small, access-large  access requests  zip of a stored object, its URL in the token
==========================  ===============  =====================================================

``base`` holds the shared loop, ``pipeline`` the batched loop of job daemons, ``shared`` what
the two both use (the move a step asks for, an item's result, the session gate; neither loop
imports the other for them), ``clients`` the choice of outside services, ``workfolder`` the job
helpers, ``registry`` the names and which of them this deployment serves (MRT_DEPLOYMENT:
``standalone``, or ``beside-merritt`` where Merritt's storage and inventory services take the
Storing and Recording jobs; MRT_OWN_STEPS), ``runner`` the threads of one process. The real
work (manifests, downloads, minting, storage, inventory, mail) is in ``queues.steps``.
"""
