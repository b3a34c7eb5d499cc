"""Fidelity checks: every operation the store adapter issues, with the result MongoDB >= 5.0
gives. Run against any server: `python selftest.py mongodb://127.0.0.1:PORT` (the same file
passes against a real mongod, which is how the expectations were chosen).

Each check names the adapter call that depends on it (see docs/store-mongo.md).
"""
import datetime
import sys
import uuid

import pymongo
from bson import Int64
from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError, OperationFailure, WriteError

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def ms(n):
    return datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=n)


def instance(wid, biz, **kw):
    d = {
        "workflow_id": wid, "type": "t", "biz_key": biz, "status": "running",
        "steps": [
            {"name": "a", "status": "completed", "attempt": 1, "elapsed_ms": Int64(5)},
            {"name": "b", "status": "failed", "attempt": 2, "elapsed_ms": Int64(7),
             "error": {"class": "permanent", "message": "x"}, "checkpoint": {"k": 1}},
            {"name": "c", "status": "pending", "attempt": 0, "elapsed_ms": Int64(0)},
        ],
        "input": {"n": 1}, "output": {}, "claimable_time": ms(1000), "revision": Int64(3),
        "retry_count": 0, "business_priority": 2,
    }
    d.update(kw)
    return d


@check
def unique_index_and_duplicate_key(db):
    """create: unique biz_key/workflow_id; the loser gets code 11000."""
    c = db.wi
    c.create_index([("biz_key", 1)], unique=True, name="biz_key_unique")
    c.create_index([("workflow_id", 1)], unique=True, name="workflow_id_unique")
    c.insert_one(instance("w1", "b1"))
    for doc in (instance("w2", "b1"), instance("w1", "b2")):
        try:
            c.insert_one(doc)
            raise AssertionError("duplicate accepted")
        except DuplicateKeyError as e:
            assert e.code == 11000
    assert c.count_documents({}) == 1


@check
def datetime_round_trip_and_range(db):
    """Times are BSON DateTime: stored as dates, compared as dates, absent never matches."""
    c = db.wi
    c.insert_many([instance("w1", "b1"), instance("w2", "b2", claimable_time=ms(5000))])
    c.insert_one({k: v for k, v in instance("w3", "b3").items() if k != "claimable_time"})
    assert c.find_one({"workflow_id": "w1"})["claimable_time"] == ms(1000)
    assert c.count_documents({"claimable_time": {"$type": "date"}}) == 2
    got = sorted(d["workflow_id"] for d in c.find({"claimable_time": {"$lte": ms(1000)}}))
    assert got == ["w1"], got


@check
def guarded_find_and_modify_hit_and_miss(db):
    """claim / apply: compound filter, $set/$unset/$inc, returns the document after."""
    c = db.wi
    c.insert_one(instance("w1", "b1", claim_token="t1"))
    miss = c.find_one_and_update(
        {"workflow_id": "w1", "status": {"$in": ["running", "failing"]}, "claimable_time": {"$lte": ms(999)}, "type": {"$in": ["t"]}},
        {"$set": {"claim_token": "t2"}}, return_document=ReturnDocument.AFTER)
    assert miss is None
    assert c.find_one({"workflow_id": "w1"})["claim_token"] == "t1"
    hit = c.find_one_and_update(
        {"workflow_id": "w1", "status": {"$in": ["running", "failing"]}, "claimable_time": {"$lte": ms(1000)}, "type": {"$in": ["t"]}},
        {"$set": {"claim_token": "t2", "claimable_time": ms(31000)}, "$inc": {"revision": Int64(1)}},
        return_document=ReturnDocument.AFTER, projection={"revision": 1, "_id": 0})
    assert hit == {"revision": 4}, hit
    assert isinstance(c.find_one({"workflow_id": "w1"})["revision"], Int64)


@check
def numeric_array_paths(db):
    """Step patches address steps.<i>.<field>: set, unset, inc (int32 stays int32)."""
    c = db.wi
    c.insert_one(instance("w1", "b1"))
    c.find_one_and_update({"workflow_id": "w1"}, {
        "$set": {"steps.2.status": "running", "steps.2.started_at": ms(7), "output.a": {"x": [1, 2]}},
        "$unset": {"steps.1.error": "", "steps.1.checkpoint": ""},
        "$inc": {"steps.2.attempt": 1, "steps.1.elapsed_ms": Int64(10), "steps.1.attempt": -1},
    })
    d = c.find_one({"workflow_id": "w1"})
    s1, s2 = d["steps"][1], d["steps"][2]
    assert s2["status"] == "running" and s2["attempt"] == 1 and type(s2["attempt"]) is int
    assert s2["started_at"] == ms(7)
    assert "error" not in s1 and "checkpoint" not in s1 and s1["attempt"] == 1
    assert s1["elapsed_ms"] == 17 and isinstance(s1["elapsed_ms"], Int64)
    assert d["output"] == {"a": {"x": [1, 2]}}
    assert len(d["steps"]) == 3


@check
def array_filters_reset_failed_steps(db):
    """Replay: steps.$[f] with f.status = failed, through findAndModify and update."""
    c = db.wi
    c.insert_one(instance("w1", "b1", status="failed"))
    upd = {"$set": {"status": "running", "steps.$[f].status": "pending", "steps.$[f].attempt": 0},
           "$unset": {"steps.$[f].error": "", "steps.$[f].checkpoint": ""}, "$inc": {"retry_count": 1}}
    d = c.find_one_and_update({"workflow_id": "w1", "status": "failed"}, upd,
                              array_filters=[{"f.status": "failed"}], return_document=ReturnDocument.AFTER)
    assert [s["status"] for s in d["steps"]] == ["completed", "pending", "pending"]
    assert d["steps"][1] == {"name": "b", "status": "pending", "attempt": 0, "elapsed_ms": 7}, d["steps"][1]
    assert d["steps"][0]["attempt"] == 1 and d["retry_count"] == 1
    again = c.find_one_and_update({"workflow_id": "w1", "status": "failed"}, upd, array_filters=[{"f.status": "failed"}])
    assert again is None


@check
def nested_wait_identity_filter(db):
    """Signal activation: equality on nested paths; int64 generation equals int32 query."""
    c = db.wi
    wait = {"kind": "signal", "signal_type": "approved", "wait_key": "k", "generation": Int64(2), "step_index": 1}
    c.insert_one(instance("w1", "b1", status="waiting", wait=wait))
    f = {"workflow_id": "w1", "status": "waiting", "wait.kind": "signal", "wait.signal_type": "approved",
         "wait.wait_key": "k", "wait.step_index": 1}
    assert c.find_one(dict(f, **{"wait.generation": Int64(1)})) is None
    assert c.find_one(dict(f, **{"wait.generation": 2})) is not None
    r = c.update_one(dict(f, **{"wait.generation": Int64(2)}), {"$unset": {"wait": ""}, "$set": {"status": "running"}})
    assert r.matched_count == 1 and "wait" not in c.find_one({"workflow_id": "w1"})


@check
def operator_shaped_values_are_data(db):
    """User values never act as operators: strings that look like operators match only
    themselves; nested $-prefixed and dotted keys are stored as data (MongoDB >= 5.0)."""
    c = db.wi
    evil = '{"$ne": null}'
    payload = {"$ne": None, "a.b": {"$gt": 1}}
    c.insert_one(instance(evil, "b1", input=payload))
    c.insert_one(instance("w2", "b2"))
    assert [d["workflow_id"] for d in c.find({"workflow_id": evil})] == [evil]
    assert c.find_one({"workflow_id": evil})["input"] == payload
    c.update_one({"workflow_id": "w2"}, {"$set": {"input": payload, "output.x": payload}})
    d = c.find_one({"workflow_id": "w2"})
    assert d["input"] == payload and d["output"]["x"] == payload


@check
def structural_step_guard(db):
    """Writes to steps.<i> also require steps.<i> to exist, so an index past the end is a
    miss instead of MongoDB padding the array with nulls."""
    c = db.wi
    c.insert_one(instance("w1", "b1"))
    assert c.find_one({"workflow_id": "w1", "steps.2": {"$exists": True}}) is not None
    assert c.find_one({"workflow_id": "w1", "steps.3": {"$exists": True}}) is None


@check
def path_conflict_is_rejected(db):
    """Two operators on one path fail (code 40) instead of applying both."""
    c = db.wi
    c.insert_one(instance("w1", "b1"))
    try:
        c.update_one({"workflow_id": "w1"}, {"$set": {"steps.1.status": "x"}, "$unset": {"steps.1": ""}})
        raise AssertionError("conflicting update accepted")
    except (WriteError, OperationFailure) as e:
        assert e.code == 40, e.code


@check
def scans_sort_limit_page(db):
    """scan_claimable / scan_due_waits / scan_pending: $in, $exists, $gt on strings,
    sort, limit."""
    c = db.wi
    for i, st in enumerate(["running", "failing", "waiting", "completed", "running"]):
        c.insert_one(instance(f"w{i}", f"b{i}", status=st, claimable_time=ms(1000 - i)))
    q = {"status": {"$in": ["running", "failing"]}, "claimable_time": {"$exists": True}}
    page1 = [d["workflow_id"] for d in c.find(q).sort("workflow_id", 1).limit(2)]
    page2 = [d["workflow_id"] for d in c.find(dict(q, workflow_id={"$gt": page1[-1]})).sort("workflow_id", 1).limit(2)]
    assert page1 == ["w0", "w1"] and page2 == ["w4"], (page1, page2)
    due = [d["workflow_id"] for d in c.find({"status": {"$in": ["running", "failing"]}, "claimable_time": {"$lte": ms(999)}}).sort("claimable_time", 1)]
    assert due == ["w4", "w1"], due


@check
def inbox_insert_and_conditional_mark(db):
    """Inbox: unique signal_id, pending -> matched once."""
    c = db.si
    c.create_index([("signal_id", 1)], unique=True)
    c.insert_one({"signal_id": "s1", "status": "pending"})
    try:
        c.insert_one({"signal_id": "s1", "status": "pending"})
        raise AssertionError("duplicate accepted")
    except DuplicateKeyError:
        pass
    first = c.update_one({"signal_id": "s1", "status": "pending"}, {"$set": {"status": "matched", "match_time": ms(5)}})
    second = c.update_one({"signal_id": "s1", "status": "pending"}, {"$set": {"status": "matched", "match_time": ms(6)}})
    assert (first.matched_count, second.matched_count) == (1, 0)
    assert c.find_one({"signal_id": "s1"})["match_time"] == ms(5)


def expect_refused(fn, codes):
    try:
        fn()
    except (OperationFailure, WriteError) as e:
        assert e.code in codes, f"code {e.code}: {e}"
        return e
    raise AssertionError("accepted")


@check
def document_over_16_mib_is_refused(db):
    """create / apply: a document over 16 MiB is refused (insert: BSONObjectTooLarge 10334;
    update: 17419 or 10334) and the stored one is unchanged -- the store maps both to
    InvalidInput, the engine fails the step whose write carried it."""
    c = db.wi
    c.insert_one(instance("w1", "b1"))
    chunk = "x" * (4 * 1024 * 1024)
    # Just over 16 MiB: a driver refuses to send a document over the limit plus 16 KiB.
    e = expect_refused(lambda: c.insert_one(instance("w2", "b2", input={"a": "x" * (16 * 1024 * 1024)})), (10334,))
    assert "too large" in str(e), e
    c.update_one({"workflow_id": "w1"}, {"$set": {"output.a": chunk, "output.b": chunk, "output.c": chunk}})
    expect_refused(lambda: c.find_one_and_update({"workflow_id": "w1"}, {"$set": {"output.d": chunk, "output.e": chunk}}),
                   (17419, 10334))
    d = c.find_one({"workflow_id": "w1"})
    assert sorted(d["output"]) == ["a", "b", "c"], sorted(d["output"])
    assert c.count_documents({}) == 1


def nested(levels):
    v = 1
    for _ in range(levels):
        v = {"n": v}
    return v


@check
def nesting_deeper_than_100_levels_is_refused(db):
    """create / apply: a document nesting deeper than MongoDB stores is refused (15
    Overflow) and nothing changes; within the kernel's payload limit (90 levels, four
    below the root) it is stored."""
    c = db.wi
    c.insert_one(instance("w1", "b1", input=nested(94)))
    expect_refused(lambda: c.insert_one(instance("w2", "b2", input=nested(150))), (15,))
    expect_refused(lambda: c.find_one_and_update({"workflow_id": "w1"}, {"$set": {"output.a": nested(150)}}), (15,))
    assert c.find_one({"workflow_id": "w1"})["output"] == {}
    assert c.count_documents({}) == 1


@check
def test_control_limits_and_drops(db):
    """mongoWireTest (this server only; skipped on a real mongod): a per-database size
    limit, and a connection dropped after the next matching write is applied."""
    try:
        db.command({"mongoWireTest": 1, "maxDocumentBytes": 64 * 1024})
    except OperationFailure as e:
        if e.code == 59:  # CommandNotFound: a real server
            return
        raise
    c = db.wi
    c.insert_one(instance("w1", "b1"))
    expect_refused(lambda: c.update_one({"workflow_id": "w1"}, {"$set": {"output.a": "x" * 70_000}}), (17419,))
    db.command({"mongoWireTest": 1, "maxDocumentBytes": 0})
    c.update_one({"workflow_id": "w1"}, {"$set": {"output.a": "x" * 70_000}})
    db.command({"mongoWireTest": 1, "dropConnectionAfterWrite": "output.pay"})
    c.update_one({"workflow_id": "w1"}, {"$set": {"output.other": 1}})  # does not match: answered
    try:
        c.find_one_and_update({"workflow_id": "w1"}, {"$set": {"output.pay": 7}})
        raise AssertionError("the connection was not dropped")
    except pymongo.errors.AutoReconnect:
        pass
    assert c.find_one({"workflow_id": "w1"})["output"]["pay"] == 7, "applied before the drop"


def main():
    uri = sys.argv[1] if len(sys.argv) > 1 else "mongodb://127.0.0.1:27017"
    client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=3000)
    failed = 0
    for fn in CHECKS:
        name = f"selftest_{uuid.uuid4().hex[:12]}"
        try:
            fn(client[name])
            print(f"ok    {fn.__name__}")
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"FAIL  {fn.__name__}: {type(e).__name__}: {e}")
        finally:
            client.drop_database(name)
    print(f"{len(CHECKS) - failed}/{len(CHECKS)} fidelity checks passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
