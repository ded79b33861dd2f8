"""The moves an operator or a door makes on the queue: submit, the moves on jobs, batches
and access requests and cleanup (``moves``), holds, priorities and caps
(``hold_moves``); what a depositor's URLs may reach (``depositors``) and the project's
own ZooKeeper launcher (``zkserver``). Imports the steps, the ZooKeeper contract and
the core; never the operator's tools, the console, the daemons or the web.
"""
