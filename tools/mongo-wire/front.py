"""A MongoDB wire-protocol (OP_MSG) front end over mongomock-ng, for tests only.

Why it exists: a real `mongod` cannot be installed on every machine that runs the test
suite, and the store adapter needs a server that behaves like MongoDB >= 5.0 on exactly the
operations it issues (see docs/store-mongo.md for the list and the fidelity checks in
`selftest.py`).

Model: one asyncio thread executes every command to completion before reading the next one,
so each command is atomic, like a single `mongod` applying one write at a time. Concurrent
clients interleave between commands, never inside one -- which is the guarantee MongoDB
gives for single-document writes.

Limits, as MongoDB enforces them: a stored document of more than --max-document-bytes
(16 MiB by default, env MONGO_WIRE_MAX_DOCUMENT_BYTES) is refused -- an insert with
BSONObjectTooLarge (10334, "object to insert too large"), an update with 17419 ("Resulting
document after update is larger than ...") -- and so is a document nesting deeper than 100
levels (15 Overflow); a refused write leaves the document as it was.

Test control, the `mongoWireTest` command (not a MongoDB command; scoped to one database,
so tests sharing the server do not see each other's settings):
  {mongoWireTest: 1, $db: D, maxDocumentBytes: N}   documents in D are limited to N bytes
                                                     (0 restores the server's limit)
  {mongoWireTest: 1, $db: D, dropConnectionAfterWrite: PATH}
      the next write in D (insert, update, delete, findAndModify) that names a field path
      starting with PATH ("" = any write) is applied, then its connection is closed
      without a reply: the client cannot know whether it happened (an uncertain outcome).
Each answers {ok: 1} with the previous setting.

Not supported (answered with the error a standalone server gives, or CommandNotSupported):
auth, TLS, compression, transactions, change streams, pipeline-style updates.

usage: python front.py [--port N] [--host H] [--port-file PATH] [--max-document-bytes N]
       (port 0 picks a free port; the chosen port is written to --port-file)
"""
import argparse
import asyncio
import collections
import copy
import datetime
import itertools
import os
import re
import signal
import struct
import sys

import bson
from bson import Int64
from bson.codec_options import CodecOptions, DatetimeConversion
import mongomock_ng as mm
from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError, OperationFailure, WriteError

import mongomock_ng.collection as _mmc
from mongomock_ng.filtering import filter_applies

# --- fidelity patches -----------------------------------------------------------------------

_orig_inc = _mmc._inc_updater


def _is_plain_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _inc_keep_int64(doc, field_name, value, codec_options=None):
    """MongoDB: int32 + int64 -> int64, int64 + int32 -> int64; mongomock returns a plain
    Python int, which the encoder would narrow back to int32 when it fits."""
    old = None
    if isinstance(doc, dict):
        old = doc.get(field_name)
    elif isinstance(doc, list):
        try:
            old = doc[int(field_name)]
        except (IndexError, ValueError):
            old = None
    _orig_inc(doc, field_name, value, codec_options)
    if not (isinstance(value, Int64) or isinstance(old, Int64)):
        return
    if isinstance(doc, dict):
        if _is_plain_int(doc.get(field_name)):
            doc[field_name] = Int64(doc[field_name])
    elif isinstance(doc, list):
        i = int(field_name)
        if _is_plain_int(doc[i]):
            doc[i] = Int64(doc[i])


_mmc._updaters["$inc"] = _inc_keep_int64

# --- protocol constants and state -----------------------------------------------------------

OPTS = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO)
OP_REPLY, OP_QUERY, OP_MSG, OP_COMPRESSED = 1, 2004, 2013, 2012
MESSAGE_BYTES_MAX = 48_000_000
CLIENT = mm.MongoClient()
CURSORS = {}
CURSOR_IDS = itertools.count(1)
CONN_IDS = itertools.count(1)
REQ_IDS = itertools.count(1)
# Same names as serverStatus.opcounters of a real server, so a test run can be measured.
OPCOUNTERS = collections.Counter()
OPCOUNTER_OF = {"insert": "insert", "find": "query", "update": "update", "delete": "delete",
                "getmore": "getmore", "findandmodify": "command"}


# What MongoDB stores at most: 16 MiB per document, 100 levels of nesting.
DOCUMENT_BYTES_MAX = 16 * 1024 * 1024
DEPTH_MAX = 100
LIMITS = {"document_bytes_max": DOCUMENT_BYTES_MAX}
# Per database, set by `mongoWireTest`: a smaller document limit, an armed connection drop.
DB_DOCUMENT_BYTES_MAX = {}
DROP_AFTER_WRITE = {}
WRITE_COMMANDS = ("insert", "update", "delete", "findandmodify")


class DropConnection(Exception):
    """Raised after a write was applied: close the connection without a reply."""


class CmdError(Exception):
    def __init__(self, code, msg, name=None):
        super().__init__(msg)
        self.code, self.msg, self.name = code, msg, name


def err_doc(code, msg, name=None):
    d = {"ok": 0.0, "errmsg": msg, "code": code}
    if name:
        d["codeName"] = name
    return d


def classify(e):
    if isinstance(e, DuplicateKeyError):
        return 11000, str(e), "DuplicateKey"
    if isinstance(e, (OperationFailure, WriteError)):
        return (e.code or 2), str(e), None
    if isinstance(e, NotImplementedError):
        return 115, f"not supported by mongomock: {e}", "CommandNotSupported"
    if isinstance(e, CmdError):
        return e.code, e.msg, e.name
    if isinstance(e, (ValueError, TypeError, bson.errors.InvalidDocument)):
        return 2, f"{type(e).__name__}: {e}", "BadValue"
    return 8, f"{type(e).__name__}: {e}", "UnknownError"


def depth_of(v):
    """Nesting levels of a document: `{}` is 1, each nested document or array adds one."""
    deepest, stack = 0, [(v, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, dict):
            deepest = max(deepest, d)
            stack.extend((y, d + 1) for y in x.values())
        elif isinstance(x, list):
            deepest = max(deepest, d)
            stack.extend((y, d + 1) for y in x)
    return deepest


def document_bytes_max(dbname):
    return DB_DOCUMENT_BYTES_MAX.get(dbname) or LIMITS["document_bytes_max"]


def check_storable(doc, dbname, inserting):
    """Refuse a document MongoDB would not store, with MongoDB's code and message."""
    if depth_of(doc) > DEPTH_MAX:
        verb = "insert" if inserting else "update"
        raise CmdError(15, f"cannot {verb} document because it exceeds {DEPTH_MAX} levels of nesting", "Overflow")
    size, limit = len(bson.encode(doc, codec_options=OPTS)), document_bytes_max(dbname)
    if size > limit:
        if inserting:
            raise CmdError(10334, f"object to insert too large. size in bytes: {size}, max size: {limit}",
                           "BSONObjectTooLarge")
        raise CmdError(17419, f"Resulting document after update is larger than {limit}", None)


def _by_id(coll, _id):
    """The stored document with this _id (a dict lookup, not a scan), or None."""
    try:
        return coll._store[_id]
    except KeyError:
        return None


def checked_update(coll, dbname, ids, do):
    """Run `do()` (an update of the documents `ids`, maybe an upsert); if a resulting
    document is too large or too deep, put every touched document back as it was and
    raise MongoDB's error."""
    before = {i: copy.deepcopy(_by_id(coll, i)) for i in ids}
    before_ids = set(coll._store._documents.keys()) if not ids else None
    res = do()
    touched = list(ids)
    if before_ids is not None:  # an upsert may have inserted one
        touched = [i for i in coll._store._documents.keys() if i not in before_ids]
    try:
        for i in touched:
            d = _by_id(coll, i)
            if d is not None:
                check_storable(d, dbname, inserting=i not in before)
    except CmdError:
        for i in touched:
            if before.get(i) is not None:
                coll._store[i] = before[i]
            elif _by_id(coll, i) is not None:
                del coll._store[i]
        raise
    return res


def write_paths(cmd, lname):
    """Field paths a write command names (for `dropConnectionAfterWrite`)."""
    docs = []
    if lname == "insert":
        docs = cmd.get("documents", [])
    elif lname == "update":
        docs = [u.get("u") for u in cmd.get("updates", [])]
    elif lname == "findandmodify":
        docs = [cmd.get("update")]
    paths = []
    for d in docs:
        if not isinstance(d, dict):
            continue
        for k, v in d.items():
            if k.startswith("$") and isinstance(v, dict):
                paths.extend(v.keys())
            else:
                paths.append(k)
    return paths


def test_control(cmd, dbname):
    out = {"ok": 1.0}
    if "maxDocumentBytes" in cmd:
        out["was"] = DB_DOCUMENT_BYTES_MAX.get(dbname, 0)
        n = int(cmd["maxDocumentBytes"])
        if n > 0:
            DB_DOCUMENT_BYTES_MAX[dbname] = n
        else:
            DB_DOCUMENT_BYTES_MAX.pop(dbname, None)
    if "dropConnectionAfterWrite" in cmd:
        out["was"] = DROP_AFTER_WRITE.get(dbname)
        DROP_AFTER_WRITE[dbname] = str(cmd["dropConnectionAfterWrite"])
    return out


def hello(conn_id):
    return {
        "helloOk": True,
        "ismaster": True,
        "isWritablePrimary": True,
        "maxBsonObjectSize": 16 * 1024 * 1024,
        "maxMessageSizeBytes": MESSAGE_BYTES_MAX,
        "maxWriteBatchSize": 100_000,
        "localTime": datetime.datetime.now(datetime.timezone.utc),
        "logicalSessionTimeoutMinutes": 30,
        "connectionId": conn_id,
        "minWireVersion": 0,
        "maxWireVersion": 17,
        "readOnly": False,
        "ok": 1.0,
    }


def cursor_reply(ns, docs, batch_size=None, single=False):
    bs = batch_size if batch_size else 101
    first, rest = docs[:bs], docs[bs:]
    cid = 0
    if rest and not single:
        cid = next(CURSOR_IDS)
        CURSORS[cid] = (ns, rest)
    return {"cursor": {"id": Int64(cid), "ns": ns, "firstBatch": first}, "ok": 1.0}


def is_operator_update(u):
    return isinstance(u, dict) and u and all(k.startswith("$") for k in u)


def check_update_doc(upd):
    """MongoDB rejects an empty update, pipeline updates are not emulated."""
    if isinstance(upd, list):
        raise NotImplementedError("pipeline-style updates")
    if not isinstance(upd, dict):
        raise CmdError(9, "update must be an object", "FailedToParse")


def check_no_path_conflict(upd):
    """MongoDB refuses an update that names one path twice or a path and its prefix
    (code 40, ConflictingUpdateOperators); mongomock applies both in order."""
    if not is_operator_update(upd):
        return
    paths = [p for op in upd.values() if isinstance(op, dict) for p in op]
    seen = sorted(paths)
    for a, b in zip(seen, seen[1:]):
        if a == b or b.startswith(a + "."):
            raise CmdError(40, f"Updating the path '{b}' would create a conflict at '{a}'",
                           "ConflictingUpdateOperators")


_POSITIONAL = re.compile(r"\$\[([a-z][A-Za-z0-9]*)?\]")


def _get_path(doc, path):
    cur = doc
    for part in path.split("."):
        if isinstance(cur, dict):
            cur = cur.get(part)
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return None
    return cur


def resolve_array_filters(doc, upd, array_filters):
    """Rewrite `arr.$[f].x` / `arr.$[].x` into concrete indices of `doc`.

    MongoDB evaluates every array filter against the document *before* the update;
    mongomock re-evaluates them path by path against the half-updated document, so
    `{$set: {"steps.$[f].status": "pending", "steps.$[f].attempt": 0}}` with
    `f.status = failed` would reset only the status. Resolving the indices up front gives
    MongoDB's result. One positional level per path is supported (all the adapter uses).
    """
    filters = {}
    for af in array_filters or []:
        idents = {k.split(".", 1)[0] for k in af}
        if len(idents) != 1:
            raise CmdError(9, f"array filter must use a single identifier: {af}", "FailedToParse")
        filters[idents.pop()] = af
    used = set()
    out = {}
    for op, fields in upd.items():
        if not isinstance(fields, dict):
            out[op] = fields
            continue
        new = {}
        for path, value in fields.items():
            ms = list(_POSITIONAL.finditer(path))
            if not ms:
                new[path] = value
                continue
            if len(ms) > 1:
                raise NotImplementedError("nested positional operators")
            m = ms[0]
            ident = m.group(1)
            prefix = path[:m.start()].rstrip(".")
            arr = _get_path(doc, prefix)
            if not isinstance(arr, list):
                raise CmdError(2, f"The path '{prefix}' must exist in the document in order to apply array updates.", "BadValue")
            if ident is None:
                idx = range(len(arr))
            else:
                if ident not in filters:
                    raise CmdError(2, f"No array filter found for identifier '{ident}' in path '{path}'", "BadValue")
                used.add(ident)
                idx = [i for i, el in enumerate(arr) if filter_applies(filters[ident], {ident: el})]
            for i in idx:
                new[path[:m.start()] + str(i) + path[m.end():]] = value
        if new:
            out[op] = new
    unused = set(filters) - used
    if unused:
        raise CmdError(9, f"The array filter for identifier '{unused.pop()}' was not used in the update", "FailedToParse")
    return out


def run_command(cmd, conn_id):
    name = next(iter(cmd))
    if "startTransaction" in cmd or "autocommit" in cmd or name in ("commitTransaction", "abortTransaction"):
        # what a standalone mongod answers
        raise CmdError(20, "Transaction numbers are only allowed on a replica set member or mongos", "IllegalOperation")
    lname = name.lower()
    OPCOUNTERS[OPCOUNTER_OF.get(lname, "command")] += 1
    dbname = cmd.get("$db", "test")
    db = CLIENT[dbname]
    if lname in ("hello", "ismaster"):
        return hello(conn_id)
    if lname in ("ping", "endsessions", "killallsessions", "getlasterror"):
        return {"ok": 1.0}
    if lname == "buildinfo":
        return {"version": "7.0.0-mongomock-ng", "versionArray": [7, 0, 0, 0], "ok": 1.0}
    if lname == "serverstatus":
        counters = {k: Int64(OPCOUNTERS[k]) for k in ("insert", "query", "update", "delete", "getmore", "command")}
        return {"host": "mongo-wire", "version": "7.0.0-mongomock-ng", "opcounters": counters, "ok": 1.0}
    if lname in ("getparameter", "getcmdlineopts", "hostinfo"):
        return {"ok": 1.0}
    if lname == "mongowiretest":
        return test_control(cmd, dbname)
    if lname == "dropdatabase":
        DB_DOCUMENT_BYTES_MAX.pop(dbname, None)
        DROP_AFTER_WRITE.pop(dbname, None)
        CLIENT.drop_database(dbname)
        return {"ok": 1.0}
    if lname == "getmore":
        cid = int(cmd["getMore"])
        ns, rest = CURSORS.pop(cid, (f"{dbname}.{cmd.get('collection')}", None))
        if rest is None:
            raise CmdError(43, f"cursor id {cid} not found", "CursorNotFound")
        bs = cmd.get("batchSize") or len(rest)
        batch, rest = rest[:bs], rest[bs:]
        if rest:
            CURSORS[cid] = (ns, rest)
        return {"cursor": {"id": Int64(cid if rest else 0), "ns": ns, "nextBatch": batch}, "ok": 1.0}
    if lname == "killcursors":
        ids = [int(c) for c in cmd.get("cursors", [])]
        for c in ids:
            CURSORS.pop(c, None)
        return {"cursorsKilled": [Int64(i) for i in ids], "cursorsNotFound": [], "cursorsAlive": [], "cursorsUnknown": [], "ok": 1.0}
    if lname == "listdatabases":
        return {"databases": [{"name": n, "sizeOnDisk": 0, "empty": False} for n in CLIENT.list_database_names()], "ok": 1.0}
    if lname == "listcollections":
        docs = [{"name": n, "type": "collection", "options": {}, "info": {"readOnly": False}} for n in db.list_collection_names()]
        return cursor_reply(f"{dbname}.$cmd.listCollections", docs)
    coll_name = cmd[name]
    if not isinstance(coll_name, str):
        raise CmdError(73, f"collection name has invalid type {type(coll_name).__name__}", "InvalidNamespace")
    coll = db[coll_name]
    ns = f"{dbname}.{coll_name}"
    if lname == "create":
        if coll_name in db.list_collection_names():
            raise CmdError(48, f"Collection {ns} already exists.", "NamespaceExists")
        db.create_collection(coll_name)
        return {"ok": 1.0}
    if lname == "drop":
        if coll_name not in db.list_collection_names():
            raise CmdError(26, "ns not found", "NamespaceNotFound")
        coll.drop()
        return {"ns": ns, "nIndexesWas": 1, "ok": 1.0}
    if lname == "insert":
        n, errs = 0, []
        for i, d in enumerate(cmd.get("documents", [])):
            try:
                check_storable(d, dbname, inserting=True)
                coll.insert_one(d)
                n += 1
            except Exception as e:  # noqa: BLE001
                code, msg, _ = classify(e)
                errs.append({"index": i, "code": code, "errmsg": msg})
                if cmd.get("ordered", True):
                    break
        r = {"n": n, "ok": 1.0}
        if errs:
            r["writeErrors"] = errs
        return r
    if lname == "update":
        n = nmod = 0
        upserted, errs = [], []
        for i, u in enumerate(cmd.get("updates", [])):
            try:
                q, upd = u.get("q", {}), u["u"]
                check_update_doc(upd)
                check_no_path_conflict(upd)
                upsert, multi = u.get("upsert", False), u.get("multi", False)
                af = u.get("arrayFilters")
                if is_operator_update(upd) and af:
                    targets = list(coll.find(q)) if multi else [d for d in [coll.find_one(q)] if d]
                    if not targets and upsert:
                        raise NotImplementedError("upsert with arrayFilters")
                    for d in targets:
                        resolved = resolve_array_filters(d, upd, af)
                        if not resolved:  # no element matched: the document still matched
                            n += 1
                            continue
                        r1 = checked_update(coll, dbname, [d["_id"]],
                                            lambda d=d, resolved=resolved: coll.update_one({"_id": d["_id"]}, resolved))
                        n += r1.matched_count
                        nmod += r1.modified_count
                    continue
                targets = [d["_id"] for d in (coll.find(q, {"_id": 1}) if multi else [coll.find_one(q, {"_id": 1})]) if d]
                if not is_operator_update(upd):
                    check_storable(upd, dbname, inserting=not targets)
                if is_operator_update(upd):
                    f = coll.update_many if multi else coll.update_one
                    res = checked_update(coll, dbname, targets, lambda: f(q, upd, upsert=upsert))
                else:
                    res = checked_update(coll, dbname, targets, lambda: coll.replace_one(q, upd, upsert=upsert))
                n += res.matched_count
                nmod += res.modified_count
                if res.upserted_id is not None:
                    n += 1
                    upserted.append({"index": i, "_id": res.upserted_id})
            except Exception as e:  # noqa: BLE001
                code, msg, _ = classify(e)
                errs.append({"index": i, "code": code, "errmsg": msg})
                if cmd.get("ordered", True):
                    break
        r = {"n": n, "nModified": nmod, "ok": 1.0}
        if upserted:
            r["upserted"] = upserted
        if errs:
            r["writeErrors"] = errs
        return r
    if lname == "delete":
        n, errs = 0, []
        for i, d in enumerate(cmd.get("deletes", [])):
            try:
                if d.get("limit", 0) == 1:
                    n += coll.delete_one(d.get("q", {})).deleted_count
                else:
                    n += coll.delete_many(d.get("q", {})).deleted_count
            except Exception as e:  # noqa: BLE001
                code, msg, _ = classify(e)
                errs.append({"index": i, "code": code, "errmsg": msg})
                if cmd.get("ordered", True):
                    break
        r = {"n": n, "ok": 1.0}
        if errs:
            r["writeErrors"] = errs
        return r
    if lname == "findandmodify":
        return find_and_modify(coll, cmd, dbname)
    if lname == "find":
        limit = cmd.get("limit", 0) or 0
        single = cmd.get("singleBatch", False) or limit < 0
        cur = coll.find(cmd.get("filter", {}) or {}, cmd.get("projection"))
        if cmd.get("sort"):
            cur = cur.sort(list(cmd["sort"].items()))
        if cmd.get("skip"):
            cur = cur.skip(int(cmd["skip"]))
        if limit:
            cur = cur.limit(abs(int(limit)))
        return cursor_reply(ns, list(cur), cmd.get("batchSize"), single)
    if lname == "aggregate":
        docs = list(coll.aggregate(cmd.get("pipeline", [])))
        return cursor_reply(ns, docs, (cmd.get("cursor") or {}).get("batchSize"))
    if lname == "count":
        q = cmd.get("query", {}) or {}
        return {"n": coll.count_documents(q) if q else coll.estimated_document_count(), "ok": 1.0}
    if lname == "distinct":
        return {"values": coll.distinct(cmd["key"], cmd.get("query")), "ok": 1.0}
    if lname == "createindexes":
        before = len(list(coll.list_indexes()))
        created = coll_name not in db.list_collection_names()
        for ix in cmd.get("indexes", []):
            kw = {k: ix[k] for k in ("unique", "sparse", "partialFilterExpression", "expireAfterSeconds") if k in ix}
            coll.create_index(list(ix["key"].items()), name=ix.get("name"), **kw)
        return {"numIndexesBefore": max(before, 1), "numIndexesAfter": len(list(coll.list_indexes())), "createdCollectionAutomatically": created, "ok": 1.0}
    if lname == "listindexes":
        if coll_name not in db.list_collection_names():
            raise CmdError(26, f"ns does not exist: {ns}", "NamespaceNotFound")
        return cursor_reply(ns, list(coll.list_indexes()))
    if lname == "dropindexes":
        idx = cmd.get("index")
        if idx == "*":
            coll.drop_indexes()
        else:
            coll.drop_index(idx)
        return {"ok": 1.0}
    raise CmdError(59, f"no such command: '{name}'", "CommandNotFound")


def find_and_modify(coll, cmd, dbname):
    q = cmd.get("query", {}) or {}
    sort = list(cmd["sort"].items()) if cmd.get("sort") else None
    fields = cmd.get("fields")
    rd = ReturnDocument.AFTER if cmd.get("new") else ReturnDocument.BEFORE
    existing = coll.find_one(q, sort=sort)
    if cmd.get("remove"):
        v = coll.find_one_and_delete(q, projection=fields, sort=sort)
        return {"lastErrorObject": {"n": 1 if v else 0}, "value": v, "ok": 1.0}
    upd = cmd.get("update")
    check_update_doc(upd)
    check_no_path_conflict(upd)
    upsert = cmd.get("upsert", False)
    if existing is None and not upsert:
        return {"lastErrorObject": {"n": 0, "updatedExisting": False}, "value": None, "ok": 1.0}
    if is_operator_update(upd):
        # mongomock's find_one_and_update ignores arrayFilters, and it would evaluate the
        # query a second time: update the one document chosen above by its _id instead.
        target = {"_id": existing["_id"]} if existing else q
        if cmd.get("arrayFilters"):
            if existing is None:
                raise NotImplementedError("upsert with arrayFilters")
            upd = resolve_array_filters(existing, upd, cmd["arrayFilters"])
        ids = [existing["_id"]] if existing else []
        res = checked_update(coll, dbname, ids, lambda: coll.update_one(target, upd, upsert=upsert)) if upd else None
        key = {"_id": existing["_id"] if existing else res.upserted_id}
        if rd is ReturnDocument.AFTER:
            v = coll.find_one(key, fields)
        elif existing is None:
            v = None
        else:
            v = _project(coll, existing, fields)
    else:
        check_storable(upd, dbname, inserting=existing is None)
        v = coll.find_one_and_replace(q, upd, projection=fields, sort=sort, upsert=upsert, return_document=rd)
    leo = {"n": 1, "updatedExisting": existing is not None}
    if existing is None and upsert:
        leo["upserted"] = v["_id"] if v and "_id" in v else None
    return {"lastErrorObject": leo, "value": v, "ok": 1.0}


def _project(coll, doc, fields):
    if not fields:
        return doc
    return coll._copy_only_fields(doc, fields, dict)


def handle_cmd(cmd, conn_id):
    """The reply to one command; raises DropConnection when a test armed a drop after
    this write (the write is applied first)."""
    try:
        reply = run_command(cmd, conn_id)
    except Exception as e:  # noqa: BLE001
        code, msg, name = classify(e)
        return err_doc(code, msg, name)
    name = next(iter(cmd)).lower()
    dbname = cmd.get("$db", "test")
    prefix = DROP_AFTER_WRITE.get(dbname)
    if prefix is not None and name in WRITE_COMMANDS and reply.get("ok") == 1.0:
        if prefix == "" or any(p.startswith(prefix) for p in write_paths(cmd, name)):
            del DROP_AFTER_WRITE[dbname]
            raise DropConnection()
    return reply


def parse_op_msg(body):
    flags = struct.unpack_from("<I", body, 0)[0]
    end = len(body) - (4 if flags & 1 else 0)
    pos, cmd, seqs = 4, None, {}
    while pos < end:
        kind = body[pos]
        pos += 1
        if kind == 0:
            ln = struct.unpack_from("<i", body, pos)[0]
            cmd = bson.decode(body[pos:pos + ln], OPTS)
            pos += ln
        elif kind == 1:
            ln = struct.unpack_from("<i", body, pos)[0]
            sec_end = pos + ln
            p = pos + 4
            z = body.index(b"\0", p)
            ident = body[p:z].decode()
            p = z + 1
            docs = []
            while p < sec_end:
                dl = struct.unpack_from("<i", body, p)[0]
                docs.append(bson.decode(body[p:p + dl], OPTS))
                p += dl
            seqs[ident] = docs
            pos = sec_end
        else:
            raise ValueError(f"unknown OP_MSG section kind {kind}")
    if cmd is None:
        raise ValueError("OP_MSG without a body section")
    for k, v in seqs.items():
        cmd[k] = v
    return flags, cmd


def op_msg_reply(req_id, doc):
    payload = struct.pack("<I", 0) + b"\0" + bson.encode(doc, codec_options=OPTS)
    return struct.pack("<iiii", 16 + len(payload), next(REQ_IDS), req_id, OP_MSG) + payload


def op_reply(req_id, doc):
    payload = struct.pack("<iqii", 0, 0, 0, 1) + bson.encode(doc, codec_options=OPTS)
    return struct.pack("<iiii", 16 + len(payload), next(REQ_IDS), req_id, OP_REPLY) + payload


async def serve_conn(reader, writer):
    conn_id = next(CONN_IDS)
    try:
        while True:
            hdr = await reader.readexactly(16)
            ln, req_id, _, op = struct.unpack("<iiii", hdr)
            if ln < 16 or ln > MESSAGE_BYTES_MAX:
                # a framing error cannot be answered reliably: drop the connection
                print(f"mongo-wire: conn {conn_id}: bad message length {ln}", file=sys.stderr, flush=True)
                return
            body = await reader.readexactly(ln - 16)
            if op == OP_MSG:
                try:
                    flags, cmd = parse_op_msg(body)
                except Exception as e:  # noqa: BLE001
                    writer.write(op_msg_reply(req_id, err_doc(9, f"malformed OP_MSG: {e}", "FailedToParse")))
                    await writer.drain()
                    continue
                reply = handle_cmd(cmd, conn_id)
                if flags & 2:  # moreToCome: no reply expected
                    continue
                try:
                    out = op_msg_reply(req_id, reply)
                except Exception as e:  # noqa: BLE001  (a reply that cannot be encoded)
                    out = op_msg_reply(req_id, err_doc(8, f"cannot encode reply: {e}", "UnknownError"))
                writer.write(out)
            elif op == OP_QUERY:
                z = body.index(b"\0", 4)
                q = body[z + 1 + 8:]
                cmd = bson.decode(q[:struct.unpack_from("<i", q, 0)[0]], OPTS)
                if "$query" in cmd:
                    cmd = cmd["$query"]
                writer.write(op_reply(req_id, handle_cmd(cmd, conn_id)))
            else:
                writer.write(op_msg_reply(req_id, err_doc(352, f"unsupported opcode {op}", "UnsupportedOpQueryCommand")))
            await writer.drain()
    except DropConnection:
        print(f"mongo-wire: conn {conn_id}: dropped after a write, as a test asked", file=sys.stderr, flush=True)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    except Exception as e:  # noqa: BLE001  (never take the server down for one connection)
        print(f"mongo-wire: conn {conn_id}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    finally:
        writer.close()


async def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=27017)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port-file", help="write the bound port here once listening")
    ap.add_argument("--max-document-bytes", type=int,
                    default=int(os.environ.get("MONGO_WIRE_MAX_DOCUMENT_BYTES", DOCUMENT_BYTES_MAX)),
                    help="largest stored document (default 16 MiB, env MONGO_WIRE_MAX_DOCUMENT_BYTES)")
    args = ap.parse_args()
    LIMITS["document_bytes_max"] = args.max_document_bytes
    server = await asyncio.start_server(serve_conn, args.host, args.port, limit=MESSAGE_BYTES_MAX)
    port = server.sockets[0].getsockname()[1]
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, args.port_file)
    print(f"mongo-wire listening on {args.host}:{port}", flush=True)
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, lambda: stop.done() or stop.set_result(None))
    async with server:
        await stop
    total = sum(OPCOUNTERS.values())
    print(f"mongo-wire stopped after {total} commands: {dict(OPCOUNTERS)}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
