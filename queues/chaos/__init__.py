"""The chaos run (``manage.py chaosrun``): the whole queue worked through by real daemon
processes while the faults an operator meets in production are caused on purpose, then judged.

- ``servers``: the loopback HTTP servers of a run (depositors, the working folders, a storage
  stand-in that makes a version for every add, as Merritt's storage does) and the black-hole
  TCP proxy;
- ``infra``: the throwaway PostgreSQL, Redis, web worker and small working disk a fault needs;
- ``depositors``: the good batches and the hostile depositors, each with the reason it must fail;
- ``faults``: each fault, caused and healed, written to the fault log;
- ``judge``: the verdict;
- ``txnlog``: the servers' transaction logs decoded, merged and replayed, judged for who
  deleted which lock and who wrote a job without holding it;
- ``engine``: one run from start to verdict.
"""
