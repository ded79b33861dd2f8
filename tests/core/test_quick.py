from queues.zk import batches, jobs


def test_smoke(zk):
    b = batches.batch_create(zk, submission={"profile": "p", "submitter": "s"})
    j = jobs.job_create(zk, bid=b.bid, configuration={"profile": "p"})
    assert j.state == "Pending"
    j2 = jobs.job_transition(zk, j, "Estimating")
    assert zk.exists(f"/jobs/states/estimating/05-{j.jid}")
    assert not zk.exists(f"/jobs/states/pending/05-{j.jid}")
    j3 = jobs.job_transition(zk, j2, "Failed", message="boom")
    assert zk.exists(f"/batches/{b.bid}/states/batch-failed/{j.jid}")
    print(zk.get(f"/jobs/{j.jid}/status")[0])
    assert j3.status.last_successful_status == "Pending"
